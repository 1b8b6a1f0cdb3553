"""EngineCore: the token-level engine. `step()` = schedule → run the model → update requests.

It knows nothing of text: the front end (OutputProcessor) detokenizes, matches stop strings and asks
the core to abort what a stop string ended.
"""

from __future__ import annotations

import functools
import logging
import time

from fdcli_engine.errors import ConfigError, InvalidRequestError
from fdcli_engine.kv_transfer.pd.params import parse_transfer_params
from fdcli_engine.outputs import EngineCoreOutput
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.request import EngineCoreRequest, Request
from fdcli_engine.request_limits import check_logit_bias, check_logprobs, check_request
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["EngineCore", "EngineCoreRequest"]

CONNECTOR_POLL_S = 0.002


def _wrong_runner(engine_is_pooling: bool) -> str:
    if engine_is_pooling:
        return (
            "this server runs a pooling model (--runner pooling): it serves /v1/embeddings, "
            "/v1/chat/reward, /v1/score and /rerank, not text generation"
        )
    return "this server runs a generative model (--runner generate): it serves no embeddings or rewards"


def _grammar_backend_maker(config: ResolvedConfig, tokenizer, vocab_size: int):
    """What builds the structured-outputs backend over the model's tokenizer (on the first constrained
    request), or None when they are off."""
    if config.guided_decoding_backend == "off":
        return None
    from fdcli_engine.structured_output import get_backend

    return functools.partial(get_backend, config.guided_decoding_backend, tokenizer, vocab_size)


class EngineCore:
    def __init__(self, config: ResolvedConfig):
        self.tp_workers = None  # tensor parallel: ranks 1..T-1 (runner/tp_executor.py)
        if config.tensor_parallel_size > 1:
            config = self._start_tensor_parallel(config)
        try:
            self._build(config)
        except BaseException:
            self.shutdown()  # an engine that failed to start leaves no worker behind
            raise

    def _build(self, config: ResolvedConfig) -> None:
        from fdcli_engine.threads import set_num_threads

        set_num_threads(config.num_threads)
        self.config = config

        from fdcli_engine.core.kv_cache_manager import KVCacheManager
        from fdcli_engine.core.scheduler import Scheduler
        from fdcli_engine.loader import load_model
        from fdcli_engine.runner.model_runner import ModelRunner
        from fdcli_engine.tokenizer import load_tokenizer

        t0 = time.perf_counter()
        self.is_pooling = config.runner == "pooling"
        self.grammar_masks = None  # the generate runner's GrammarMasks
        if self.is_pooling:
            from fdcli_engine.models.adapters import load_pooling_model
            from fdcli_engine.runner.pooling_runner import PoolingModelRunner

            self.model = load_pooling_model(config)
            eos: set[int] = set()
            self.runner = PoolingModelRunner(config, self.model)
        else:
            self.model = load_model(config)
            if self.tp_workers is not None:
                from fdcli_engine.runner.tp_executor import TPModel

                self.model = TPModel(self.model, self.tp_workers)
            tokenizer = load_tokenizer(config)
            eos = set(tokenizer.eos_token_ids)
            make_backend = _grammar_backend_maker(config, tokenizer, self.model.vocab_size)
            self.runner = ModelRunner(config, self.model, eos, make_backend)
            self.grammar_masks = self.runner.grammar
            if self.tp_workers is not None:
                self.model.start(self.runner.num_blocks)
        self.vocab_size = self.model.vocab_size
        capacity = self.runner.num_blocks * config.block_size
        if capacity < config.max_model_len:
            raise ConfigError(
                f"the KV cache holds {capacity} tokens, fewer than --max-model-len {config.max_model_len}: "
                "raise --num-kv-blocks / --kv-cache-memory-gb or lower --max-model-len"
            )
        kv = KVCacheManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        spec = config.speculative_config if not self.is_pooling else None
        proposer = getattr(self.runner, "proposer", None)
        self.scheduler = Scheduler(
            kv,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            eos_token_ids=eos,
            num_speculative_tokens=spec.num_speculative_tokens if spec is not None else 0,
            num_lookahead_slots=proposer.num_lookahead_slots if proposer is not None else 0,
            disable_by_batch_size=spec.disable_by_batch_size if spec is not None else None,
        )
        if spec is not None:
            logger.info("speculative decoding: %s", spec.describe())
        from fdcli_engine.kv_transfer.factory import make_connector

        connector = make_connector(config)
        if connector is not None:
            self.bind_kv_connector(connector)
        from fdcli_engine import ops
        from fdcli_engine.threads import BIND_ENV

        bound = ops.bind_engine_threads(config.num_threads)
        if bound:
            logger.info("OpenMP threads bound to CPUs %s (%s)", bound, BIND_ENV)
        logger.info("engine ready in %.1f s (kernels: %s)", time.perf_counter() - t0, ops.describe())

    def _start_tensor_parallel(self, config: ResolvedConfig) -> ResolvedConfig:
        """Start the workers and join their group before the model is built (its layers read the
        group). Returns the config with every TP rank's CPUs decided; rank 0 runs on the first set."""
        import atexit
        import os

        from fdcli_engine.distributed import set_tp_group
        from fdcli_engine.runner.tp_executor import TPWorkers
        from fdcli_engine.threads import BIND_ENV

        self.tp_workers = TPWorkers(config)
        atexit.register(self.tp_workers.close)
        config = self.tp_workers.config
        if config.tp_rank_cpus and config.cpus == config.tp_rank_cpus[0]:
            config = config.replace(num_threads=len(config.cpus))
        # Rank 0's OpenMP team on rank 0's CPUs (ops.bind_engine_threads at the end of start-up): the
        # engine-core process set this already; an in-process engine's caller gets it here.
        os.environ[BIND_ENV] = ",".join(str(c) for c in config.cpus)
        try:
            set_tp_group(self.tp_workers.init_group())
        except BaseException:
            self.tp_workers.close(timeout=1.0)
            raise
        return config

    def bind_kv_connector(self, connector) -> None:
        """Give the scheduler a KV connector (kv_transfer/base.py) over this engine's pool, replacing
        any bound before. Only one process's pool can be seen: a sharded or a pooling pool has none."""
        if self.is_pooling:
            raise ConfigError(
                "KV offload and transfer need a generative model's KV cache: a pooling runner keeps none "
                "between requests"
            )
        if self.tp_workers is not None:
            raise ConfigError(
                "KV offload and transfer are not supported with --tensor-parallel-size > 1 (the KV cache "
                "is split across processes): use --tensor-parallel-size 1"
            )
        if self.kv_connector is not None:
            self.kv_connector.close()
        connector.bind(self.runner.kv_block_views())
        self.scheduler.kv.bind_connector(connector)

    @property
    def kv_connector(self):
        """The bound KV connector (None: none), as the scheduler's KV cache manager holds it."""
        scheduler = getattr(self, "scheduler", None)  # absent while _build has not made it
        return scheduler.kv.connector if scheduler is not None else None

    def shutdown(self) -> None:
        """Close the KV connector, stop the tensor-parallel workers and leave this process's group."""
        if self.kv_connector is not None:
            self.kv_connector.close()
        if self.tp_workers is None:
            return
        from fdcli_engine.distributed import SingleRank, set_tp_group, tp_group

        self.tp_workers.close()
        group = tp_group()
        if hasattr(group, "close"):
            group.close()
        set_tp_group(SingleRank())  # a model built later in this process is unsharded again

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams | PoolingParams) -> None:
        """The request's kind is the kind of its params: PoolingParams pools, SamplingParams generates."""
        is_pooling = isinstance(params, PoolingParams)
        if is_pooling != self.is_pooling:
            raise InvalidRequestError(_wrong_runner(self.is_pooling), param="model")
        check_request(
            prompt_token_ids,
            None if is_pooling else params.max_tokens,
            max_model_len=self.config.max_model_len,
            vocab_size=self.vocab_size,
            pooling=is_pooling,
            prompt_param="input" if is_pooling else "prompt",
        )
        if not is_pooling:
            check_logit_bias(params.logit_bias, self.vocab_size)
            check_logprobs(params.logprobs, params.prompt_logprobs, self.config.max_logprobs)
            parse_transfer_params(params.kv_transfer_params, self.config.splitwise_role)
            if params.structured_outputs is not None and self.config.guided_decoding_backend == "off":
                raise InvalidRequestError(
                    "structured outputs are off on this server (--guided-decoding-backend off): "
                    "start it with --guided-decoding-backend auto to use them",
                    param="structured_outputs",
                )

    def check_mm_features(self, prompt_token_ids: list[int], mm_features) -> None:
        """Images reach only a model that takes them, each owning its own placeholder range."""
        if not hasattr(self.model, "embed_images"):
            name = self.config.served_model_name or self.config.model
            raise InvalidRequestError(f"model {name} does not accept images", param="messages")
        end = 0
        for f in sorted(mm_features, key=lambda f: f.offset):
            if f.offset < end or f.length <= 0 or f.end > len(prompt_token_ids):
                raise InvalidRequestError(
                    "image placeholders outside the prompt or overlapping", param="messages"
                )
            end = f.end

    def add_request(self, req: EngineCoreRequest) -> None:
        self.validate_request(req.prompt_token_ids, req.params)
        if req.mm_features:
            self.check_mm_features(req.prompt_token_ids, req.mm_features)
        request = Request(
            req.req_id,
            req.prompt_token_ids,
            req.sampling_params,
            max_model_len=self.config.max_model_len,
            arrival_time=req.arrival_time or None,
            pooling_params=req.pooling_params,
            mm_features=req.mm_features,
        )
        self.scheduler.add_request(request)
        so = req.sampling_params.structured_outputs if req.sampling_params is not None else None
        if so is not None and self.grammar_masks is not None:
            self.grammar_masks.prepare(req.req_id, so)

    def abort_requests(self, req_ids: list[str]) -> list[EngineCoreOutput]:
        return self.scheduler.abort_requests(req_ids)

    def step(self) -> list[EngineCoreOutput]:
        so = self.scheduler.schedule()
        out = self.runner.execute(so)
        if so.is_empty:
            if self.scheduler.num_deferred:
                time.sleep(CONNECTOR_POLL_S)  # only requests waiting on a connector: poll, do not spin
            return []
        outputs = self.scheduler.update_from_output(so, out)
        if out.failed:  # only those requests end; the step and the others go on
            for rid, why in out.failed.items():
                logger.warning("request %s aborted: %s", rid, why)
            outputs += self.scheduler.abort_requests(list(out.failed))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> dict:
        stats = self.scheduler.get_stats()
        backend = self.grammar_masks.backend if self.grammar_masks is not None else None
        if backend is not None:  # structured outputs: compile counters (metrics, bench)
            g = backend.stats()
            stats["grammar_compiles"] = g["compiles"]
            stats["grammar_cache_hits"] = g["cache_hits"]
            stats["grammar_compile_errors"] = g["compile_errors"]
            stats["grammar_compile_seconds"] = g["compile_seconds"]
        if self.kv_connector is not None:
            stats.update(self.kv_connector.stats())
        return stats

    def reset_prefix_cache(self) -> None:
        self.scheduler.kv.reset_prefix_cache()
