"""fd's C++ CPU operators for Paddle, and the interface they own.

- `fd_kernels.native`: the Python bindings of the C++ operators (csrc/), built by `fd_kernels.build`;
- `fd_kernels.reference`: the same ops in pure Paddle (numpy for the sampler), the test oracle;
- `fd_kernels.sampler_layout`: the sampler's row layout; `fd_kernels.packing`: the packed weight formats;
- `fd_kernels.errors`: `KernelBuildError`;
- `fd_kernels.native.kv_s8`: the C8 cache's row rule on numpy arrays, for KV offload's int8 tier (not an
  op: ctypes, like the sampler).

This package imports nothing from the engine (an import-linter contract holds it); importing it (this
module) loads nothing else. `fdcli_engine.ops` binds one implementation's ops under these names.

Signatures (all tensors are paddle.Tensor on CPU, float32 unless stated):
    rms_norm(x[T,H], weight[H], eps) -> [T,H]
    fused_add_rms_norm(x[T,H], residual[T,H], weight[H], eps) -> (normed[T,H], x + residual)
    rotary_embedding(positions int64[T], q[T,nh*hd], k[T,nkv*hd], cos_sin_cache[max_pos,hd], head_dim)
        -> (q, k) with NeoX (rotate-half) rotary applied; cos_sin_cache[p] = [cos(p*f_0..), sin(p*f_0..)]
    silu_and_mul(x[T,2I]) -> silu(x[:, :I]) * x[:, I:]
    prepare_linear(weight np.float32[out,in], bias np.float32[out] | None, quantization, row_scale=None)
        -> LinearWeight   (row_scale: wint8's per-row scales where given, else max|row| / 127)
    prepare_linear_gguf(raw uint8[out, bytes_per_row], ggml_type, in_features, bias) -> LinearWeight
        GGUF Q4_0/Q4_1/Q8_0 blocks kept as they are (the reference dequantizes: the oracle)
    linear_argmax(x[T,in], lw: LinearWeight) -> list[int] | None
        each row's first argmax (ties to the lowest index) of linear(x, lw)'s logits, the same bits, or
        None when a row holds a NaN (the greedy fast path leaves those rows to `sample`); the native op
        writes no logits tensor (csrc/lm_head_argmax.cc)
    linear(x[T,in], lw: LinearWeight, prompt_rows=None) -> [T,out]
        prompt_rows uint8[T] | None: 1 on the step's prompt-token rows (AttentionMetadata.prompt_rows,
        None when the step has none); on AMX and AVX512-BF16 CPUs the native linear computes those rows
        of quantized weights in bf16, and ignores a mask whose length is not x's row count (the
        reference ignores it)
    embedding(ids int64[...], lw: LinearWeight from prepare_linear_gguf) -> [..., in]: rows `ids` of the
        [out, in] weight as fp32 (a token embedding read from the GGUF blocks it shares with the LM head)
    reshape_and_cache(k[T,nkv,hd], v[T,nkv,hd], k_cache[nb,nkv,bs,hd], v_cache, slot_mapping int64[T],
                      k_scales=None, v_scales=None)
        writes in place
    paged_attention(q[T,nh,hd], k_cache, v_cache, meta: AttentionMetadata, scale, k_scales=None,
                    v_scales=None) -> [T,nh,hd]
        causal: query i of sequence b sits at position seq_len_b - q_len_b + i and attends to keys
        0..that position of its own sequence, read through its block table; GQA by nh // nkv.
        meta.prompt_rows (native only; numerics, not results, differ from the reference): prompt queries
        take the prefill path and generated-token queries their decode step's, so a row's bits never
        depend on what else the step holds (recompute after preemption, chunked prefill).
    With k_scales / v_scales fp32 [nb,nkv,bs] (the C8 cache, --kv-cache-dtype int8) the caches are int8:
    reshape_and_cache stores each (token, head) row as codes + scale (reference.quantize_kv_s8), and
    paged_attention reads code * scale. Without them the caches are float32, or bfloat16 (the bf16
    cache, --kv-cache-dtype bfloat16): reshape_and_cache rounds each value to nearest even
    (reference.round_bf16) and paged_attention reads it widened to fp32, exactly.
    sample(logits np.float32[B,V], params np.float64[B,7], ids np.int64[N], meta np.int64[B,4],
           uniforms np.float64[B,R], rejection) -> np.int64[B]
        numpy in and out (the sampler works on the host): penalties, bans, temperature, top-k/top-p/min-p
        and the draw per row; layout in `sampler_layout`, semantics in
        `reference.sampler`
    varlen_attention(q[T,nh,hd], k[T,nh,hd], v[T,nh,hd], cu_seqlens int[B+1], scale) -> [T,nh,hd]
        bidirectional (non-causal, encoder): token i of sequence b (tokens cu_seqlens[b] ..
        cu_seqlens[b+1]) attends to every token of sequence b; no KV cache. q/k/v may be views.
    gelu(x) -> x * Phi(x) (exact, erf-based GELU)
    add_layer_norm(x[T,H], residual[T,H], weight[H], bias[H], eps) -> layer_norm(x + residual)
        (post-norm: the sum itself is not returned)
    prepare_decoder_stack(layers: list[dict], final_norm, cos_sin_cache, num_heads, num_kv_heads,
                          head_dim, eps, scale, embedding=None, head=None) -> DecoderStack
    decoder_stack(x[T,H], positions, kv_caches, meta, stack, prompt_rows=None, out=None) -> [T,H]
        (or [K,H]: with `out`, the metadata of K rows that are read, the last layer computes only them;
        x may be int64 token ids [T] where the stack was given the embedding's table)
        native only (None under the reference, whose oracle is the per-op loop itself): every layer of a
        Llama-family decoder and its final norm in one C++ call, bit-identical to the per-op loop of
        models/decoder.py (prompt_rows as in linear); see native.prepare_decoder_stack for
        the layer dicts.
    decoder_stack_greedy(same arguments) -> (hidden, tokens: list[int] | None): native only, a stack
        packed with head=: decoder_stack and each output row's linear_argmax over the LM head in one op;
        a step of token ids without prompt_rows / out runs through ctypes (native/stack_step.py), its
        hidden states then the stack's buffer, written again by its next such step
    prompt_tile_min_rows() -> int
        native only: the prompt-row count from which kS8 / kU4 linears change path (kernels.h); a
        subset of a step's prompt rows keeps at least min(this, all) of them to keep their bits
    huge_pages(tensors: list, touched=True) -> int: back the tensors' memory with 2 MB transparent huge
        pages in place (weights after load); touched=False for memory not written yet (a KV cache before
        its zero fill): advice that its first touch takes huge pages. Returns the bytes. Never fails: 0
        under the reference, with FD_HUGEPAGES=0, or where the kernel refuses (native/thp.py)
"""

OP_NAMES = (
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "prepare_linear",
    "prepare_linear_gguf",
    "linear",
    "linear_argmax",
    "embedding",
    "reshape_and_cache",
    "paged_attention",
    "sample",
    "varlen_attention",
    "gelu",
    "add_layer_norm",
    "prepare_decoder_stack",
    "decoder_stack",
    "decoder_stack_greedy",
    "prompt_tile_min_rows",
    "huge_pages",
)
