"""The tiny ERNIE-4.5 architectures the tests build. Not in conftest.py: a test importing `conftest` gets
whichever directory's conftest pytest loaded last when several test directories are collected in one run."""

DENSE = "Ernie4_5ForCausalLM"
MOE = "Ernie4_5_MoeForCausalLM"
# Four layers: dense, MoE, dense, MoE (start 1, interval 2), so alternation is exercised. Eight experts,
# top-2, one shared expert. rope_theta 10000 (tiny_models' default) keeps rotary angles varied at the
# short positions tested.
MOE_OVERRIDES = dict(
    num_hidden_layers=4,
    moe_num_experts=8,
    moe_k=2,
    moe_intermediate_size=32,
    moe_num_shared_experts=1,
    moe_layer_start_index=1,
    moe_layer_end_index=-1,
    moe_layer_interval=2,
)
# Dense: untied LM head (lm_head.weight is stored, transposed in the Paddle layout); MoE: tied.
OVERRIDES = {DENSE: dict(head_dim=16, tie_word_embeddings=False), MOE: dict(MOE_OVERRIDES, head_dim=16)}
