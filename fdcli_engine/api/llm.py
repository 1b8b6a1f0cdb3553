"""Offline, in-process API, vLLM's: `LLM(model=...).generate(prompts, params)`, `.chat(messages, params)`
and, on a pooling model, `.embed` / `.encode` / `.classify` / `.score` (llm_pooling.py)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from fdcli_engine.api.llm_pooling import PoolingMethods
from fdcli_engine.api.prompt_inputs import ParsedPrompt, parse_prompts
from fdcli_engine.beam_search import BeamSearchOutput, BeamSearchParams
from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.errors import ConfigError, InvalidRequestError
from fdcli_engine.multimodal.image_limit import parse_image_limit
from fdcli_engine.multimodal.media_flags import policy_from_flags
from fdcli_engine.outputs import RequestOutput
from fdcli_engine.reasoning_budget import markers_for_prompt
from fdcli_engine.sampling_params import RequestOutputKind, SamplingParams

# vLLM's forms: text, token ids, {"prompt": str} or {"prompt_token_ids": [...]} (see prompt_inputs.py).
PromptType = str | list[int] | dict


def merge_children(parent_id: str, children: list[RequestOutput]) -> RequestOutput:
    """One RequestOutput of a prompt's n sequences; `metrics` only with one (each sequence ran as its
    own engine request, with its own times)."""
    first = children[0]
    outs = sorted((c.outputs[0] for c in children), key=lambda o: o.index)
    return RequestOutput(
        request_id=parent_id,
        prompt=first.prompt,
        prompt_token_ids=first.prompt_token_ids,
        outputs=outs,
        finished=all(c.finished for c in children),
        num_cached_tokens=first.num_cached_tokens,
        prompt_logprobs=first.prompt_logprobs,
        metrics=first.metrics if len(children) == 1 else None,
    )


class LLM(PoolingMethods):
    """A synchronous wrapper of the in-process engine client: it registers requests with the client's
    front end and steps the core on the caller's thread (no event loop, no worker thread)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        limit_mm_per_prompt: str | dict | None = None,
        allowed_local_media_path: str | None = None,
        allowed_media_domains: list[str] | None = None,
        **engine_options,
    ):
        # Options first: a bad one (e.g. speculative_config) raises ConfigError before paddle loads.
        # vLLM's LLM(limit_mm_per_prompt=..., allowed_local_media_path=..., allowed_media_domains=...)
        self._image_limit = parse_image_limit(limit_mm_per_prompt)
        self._media_policy = policy_from_flags(allowed_local_media_path, allowed_media_domains)
        self.config = resolve_config(
            EngineConfig.from_dict({"model": model, **engine_options}, source="LLM()")
        )
        if self.config.data_parallel_size > 1:
            raise ConfigError(
                f"LLM(data_parallel_size={self.config.data_parallel_size}): the in-process engine is one "
                "engine core; data parallelism runs its ranks as processes (fd serve or fd run-batch "
                "--data-parallel-size)"
            )
        if self.config.distributed_executor_backend == "ray":
            raise ConfigError(
                "LLM(distributed_executor_backend='ray'): the in-process engine runs here; Ray runs "
                "fd run-batch's engines (fd run-batch --distributed-executor-backend ray)"
            )
        from fdcli_engine.api.inproc_client import InProcessEngineClient
        from fdcli_engine.engine import EngineCore
        from fdcli_engine.tokenizer import load_tokenizer

        self.engine = EngineCore(self.config)
        self.tokenizer = load_tokenizer(self.config)
        self.client = InProcessEngineClient(
            self.config, self.tokenizer, core=self.engine, step_in_thread=False
        )
        self._finals = _Finals()
        self._ids = itertools.count()
        self._image_processor = ...  # the model's (multimodal/processor.py), made at the first image

    @property
    def image_processor(self):
        """The model's ImageProcessor, or None for a text-only model."""
        if self._image_processor is ...:
            from fdcli_engine.multimodal.processor import get_image_processor

            self._image_processor = get_image_processor(
                self.config.hf_config, self.config.model_path, self.config.mm_processor_kwargs
            )
        return self._image_processor

    def _with_images(self, ids: list[int], images: list, kwargs: dict | None) -> tuple[list[int], list]:
        """(ids with each image placeholder expanded, the images' features); none without images."""
        if not images:
            return ids, []
        if self.image_processor is None:
            raise InvalidRequestError(
                f"model {self.config.served_model_name or self.config.model} does not accept images",
                param="multi_modal_data",
            )
        if len(images) > self._image_limit:
            raise InvalidRequestError(
                f"at most {self._image_limit} images per prompt (limit_mm_per_prompt), got {len(images)}",
                param="multi_modal_data",
            )
        return self.image_processor.process(list(ids), images, kwargs)

    def _prompt_ids(self, prompt: ParsedPrompt) -> tuple[list[int], list]:
        """(the prompt's ids, its images' features): its text encoded unless given as ids."""
        ids = self.tokenizer.encode(prompt.text) if prompt.token_ids is None else prompt.token_ids
        return self._with_images(ids, prompt.images, prompt.mm_processor_kwargs)

    @property
    def processor(self):
        return self.client.output_processor

    def get_tokenizer(self):
        """vLLM's accessor of the model's tokenizer (also `llm.tokenizer`)."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: the SamplingParams a call without any uses, SamplingParams' defaults overlaid with
        the model's (generation_config.py; a max_new_tokens there is max_tokens). Given params are
        used as they are, as in vLLM: start from these to keep the model's defaults."""
        return SamplingParams(**self.config.default_sampling_params)

    def _normalize(self, prompts, params) -> tuple[list[ParsedPrompt], list[SamplingParams]]:
        prompts = parse_prompts(prompts)
        if params is None:
            params = self.get_default_sampling_params()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        return prompts, plist

    def generate(
        self,
        prompts: PromptType | list[PromptType],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request=None,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's LLM.generate. `priority` is accepted and has no effect (fd schedules first come, first
        served, as the server's `priority` field); fd has no LoRA adapters, so `lora_request` must be None."""
        _check_no_lora(lora_request)
        return self._generate(prompts, sampling_params, use_tqdm)

    def _generate(self, prompts, sampling_params, use_tqdm: bool, chat_template: str | None = None):
        """generate's work; `chat_template`: the one chat() rendered with (for the reasoning markers)."""
        prompts, plist = self._normalize(prompts, sampling_params)
        parents: list[tuple[str, list[str]]] = []
        try:
            for prompt, params in zip(prompts, plist):
                text = prompt.text
                ids, features = self._prompt_ids(prompt)
                parent = str(next(self._ids))
                child_ids = [f"{parent}-{i}" for i in range(params.n)]
                parents.append((parent, child_ids))
                markers = self._reasoning_markers(params, ids, chat_template)
                bad_words = params.bad_words_ids(self._encode_plain) + params.bad_words_token_ids
                for i, cid in enumerate(child_ids):
                    child = params.for_sample(i)
                    child.reasoning_markers = markers
                    child.bad_words_token_ids = bad_words
                    if prompt.cache_salt is not None:
                        child.cache_salt = prompt.cache_salt
                        child.validate()
                    child.output_kind = RequestOutputKind.FINAL_ONLY  # only the finished outputs are read
                    self.add_request(cid, ids, child, prompt=text, index=i, mm_features=features)
            done = self.run_until_done(sum(len(c) for _, c in parents), use_tqdm)
        finally:  # a refused prompt leaves none of the earlier ones behind in the engine
            for _, cids in parents:
                for cid in cids:
                    self.client.abort(cid)
        return [merge_children(p, [done[c] for c in cids]) for p, cids in parents]

    def _encode_plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _reasoning_markers(self, params: SamplingParams, ids: list[int], chat_template: str | None):
        """Where a budgeted request's reasoning block lies (reasoning_budget.markers_for_prompt). The
        offline LLM has no reasoning parser: the <think> tags, the prompt and the chat template decide,
        as FastDeploy's offline engine reads the tokenizer's </think>. Given markers are kept."""
        budgeted = params.reasoning_budget is not None or params.response_max_tokens is not None
        if params.reasoning_markers is not None or not budgeted:
            return params.reasoning_markers
        return markers_for_prompt(
            self._encode_plain,
            self.tokenizer.decode(ids, skip_special_tokens=False),
            chat_template or self.tokenizer.chat_template,
        )

    def add_request(
        self,
        req_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        prompt=None,
        index=0,
        mm_features=None,
    ):
        """Queue one sequence; `run_until_done` (or the caller's own stepping) produces it. A
        constraint that does not compile is a ValueError (InvalidRequestError) here, as in vLLM,
        not a request that ends empty with finish_reason "abort"."""
        so = getattr(params, "structured_outputs", None)
        masks = self.engine.grammar_masks
        if so is not None and masks is not None and self.config.guided_decoding_backend != "off":
            masks.check(so)
        self.client.open_request(
            req_id, prompt_ids, params, self._finals, prompt=prompt, index=index, mm_features=mm_features
        )

    def run_until_done(self, total: int, use_tqdm: bool = False) -> dict[str, RequestOutput]:
        """Step until the core is idle; the finished output of every request added since the last run."""
        progress = _Progress(total) if use_tqdm else None
        self._finals.on_finished = progress.advance if progress else None
        try:
            while self.engine.has_unfinished_requests():
                self.client.step()
        finally:
            if progress:
                progress.close()
        return self._finals.take()

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
        *,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        mm_processor_kwargs: dict | None = None,
        lora_request=None,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: each conversation rendered by the same rule as fd serve's chat route
        (tokenizer/chat_render.py: continue_final_message, tools, chat_template_kwargs), then
        generated. A bad combination is a ValueError (InvalidRequestError) naming the argument.
        chat_template_content_format takes the server flag's values and, as there, changes nothing:
        a text-only content list is one string and a list with images stays a list."""
        from fdcli_engine.api.llm_images import split_chat_images
        from fdcli_engine.tokenizer.chat_render import render_chat
        from fdcli_engine.vllm_compat import CONTENT_FORMATS

        if chat_template_content_format not in CONTENT_FORMATS:
            raise InvalidRequestError(
                f"chat_template_content_format {chat_template_content_format!r}: use "
                + ", ".join(CONTENT_FORMATS),
                param="chat_template_content_format",
            )

        _check_no_lora(lora_request)
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts, requests = [], []
        for conv in conversations:
            conv, images = split_chat_images(conv, self._media_policy)
            text, ids = render_chat(
                self.tokenizer,
                conv,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template=chat_template,
                chat_template_kwargs=chat_template_kwargs,
                tools=tools,
            )
            prompts.append(text)
            # The template writes the special tokens itself (as the server's chat route encodes).
            ids = self.tokenizer.encode(text, add_special_tokens=False) if ids is None else ids
            request: dict = {"prompt_token_ids": ids}
            if images:
                request["multi_modal_data"] = {"image": images}
                if mm_processor_kwargs:
                    request["mm_processor_kwargs"] = mm_processor_kwargs
            requests.append(request)
        outs = self._generate(requests, sampling_params, use_tqdm, chat_template)
        for o, p in zip(outs, prompts):
            o.prompt = p
        return outs

    def beam_search(
        self,
        prompts: PromptType | list[PromptType],
        params: BeamSearchParams,
        lora_request=None,
        use_tqdm: bool = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search (beam_search.py): each prompt's best `params.beam_width` beams, best
        first; a sequence's `tokens` and `text` hold the prompt and the generated tokens."""
        from fdcli_engine.beam_search import next_token_logprobs, run, search

        _check_no_lora(lora_request)
        params.check_width(self.config.max_logprobs)
        parsed = parse_prompts(prompts)
        ids = []
        for prompt in parsed:
            prompt_ids, features = self._prompt_ids(prompt)
            if features:
                raise InvalidRequestError("beam search takes text prompts, not images", param="prompts")
            ids.append(prompt_ids)
        step_params = params.step_params()

        def engine_step(batch: list[list[int]]) -> list:
            outs = self.generate([{"prompt_token_ids": t} for t in batch], step_params)
            return [next_token_logprobs(o) for o in outs]

        outputs = run(search(ids, params, set(self.tokenizer.eos_token_ids)), engine_step)
        for out in outputs:
            for seq in out.sequences:
                # As the output processor decodes: an id past the vocabulary (a padded embedding
                # table) is no text rather than an error.
                seq.text = self.tokenizer.backend.decode(seq.tokens, skip_special_tokens=True)
        return outputs

    def reset_prefix_cache(self) -> None:
        """vLLM's: forget every cached prefix (the next prompts are computed in full)."""
        self.engine.reset_prefix_cache()

    def get_stats(self) -> dict:
        return self.engine.get_stats()


def _check_no_lora(lora_request) -> None:
    from fdcli_engine.vllm_compat import NO_LORA

    if lora_request is not None:
        raise InvalidRequestError(
            f"lora_request is not supported: {NO_LORA}; pass lora_request=None", param="lora_request"
        )


class _Finals:
    """The LLM's sink for every request: keeps finished outputs, raises a request's error when taken."""

    def __init__(self) -> None:
        self.done: dict[str, RequestOutput] = {}
        self.error: BaseException | None = None
        self.on_finished = None

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            self.error = self.error or item
        elif item.finished:
            self.done[item.request_id] = item
            if self.on_finished is not None:
                self.on_finished()

    def take(self) -> dict[str, RequestOutput]:
        done, error = self.done, self.error
        self.done, self.error = {}, None
        if error is not None:
            raise error
        return done


class _Progress:
    """A Rich progress bar on stderr."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import Progress

        self._p = Progress(console=Console(stderr=True), transient=True)
        self._p.start()
        self._task = self._p.add_task("generating", total=total)

    def advance(self) -> None:
        self._p.advance(self._task)

    def close(self) -> None:
        self._p.stop()
