"""Beam search, as vLLM runs it: on top of the engine, one token per step. Every live beam is a request
for one token with the 2 x beam_width most likely next tokens' logprobs; of all the extended beams the
beam_width with the highest cumulative logprob live on, and a beam that draws an end-of-sequence token
is complete. After max_tokens steps (or when no beam is left) the complete and live beams are ranked by
cumulative logprob / length ** length_penalty, the length counting the prompt and leaving out a final
end-of-sequence token (vLLM's and transformers' score), and the best beam_width are the answer.

Prefix caching makes a step cost one token per beam: each beam's prompt is the previous step's prompt
plus one token. `search` is the algorithm alone, a generator that yields each step's prompts and is sent
their next-token logprobs, so the offline LLM (api/llm.py) and the server (serving_common.merge_jobs)
drive the very same code, one synchronously and one on the event loop."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import CompletionOutput, Logprob, RequestOutput
from fdcli_engine.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams (the offline `LLM.beam_search` argument; a request's `use_beam_search`
    with `n` as the width)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise InvalidRequestError(f"beam_width must be at least 1, got {self.beam_width}", param="n")
        if self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens"
            )
        if self.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be at least 0, got {self.temperature}", param="temperature"
            )

    def check_width(self, max_logprobs: int) -> None:
        """A step asks for 2 x beam_width logprobs, at most --max-logprobs."""
        if 2 * self.beam_width > max_logprobs:
            raise InvalidRequestError(
                f"beam search with width {self.beam_width} needs {2 * self.beam_width} logprobs a step, "
                f"over --max-logprobs {max_logprobs}: use a width of at most {max_logprobs // 2}",
                param="n",
            )

    def step_params(self, logprobs: int | None = None) -> SamplingParams:
        """One step of one beam: a single token, with the 2 x beam_width best next tokens' logprobs, or
        the `logprobs` best where a request asks its answer's tokens for more alternatives than that
        (the search still looks at the 2 x beam_width best alone: `candidates`)."""
        return SamplingParams(
            max_tokens=1,
            temperature=self.temperature,
            logprobs=max(2 * self.beam_width, logprobs or 0),
            ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )


@dataclass
class BeamSearchSequence:
    """A beam: the prompt's and generated tokens, each generated position's logprobs dict (vLLM's
    shape), the cumulative logprob; text and finish_reason once returned."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None


@dataclass
class BeamSearchOutput:
    """The best beams of one prompt, best first (vLLM's `LLM.beam_search` result)."""

    sequences: list[BeamSearchSequence]


def beam_score(beam: BeamSearchSequence, eos_ids: set[int], length_penalty: float) -> float:
    """cumulative logprob / length ** length_penalty; the length leaves out a final end-of-sequence token."""
    length = len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1] in eos_ids else 0)
    return beam.cum_logprob / (length**length_penalty)


# What `search` yields (each live beam's tokens, in order) and is sent back (each one's next-token
# logprobs dict, or None where the engine ended the beam without a token: the context is full).
Step = Generator[list[list[int]], list["dict[int, Logprob] | None"], list[BeamSearchOutput]]


def search(prompts: list[list[int]], params: BeamSearchParams, eos_ids: set[int]) -> Step:
    """The beam search of each prompt, all prompts' beams in one batch per step; returns each prompt's
    BeamSearchOutput (tokens include the prompt; text is left to the caller)."""
    live = [[BeamSearchSequence(tokens=list(p))] for p in prompts]
    done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    for _ in range(params.max_tokens):
        batch = [beam for beams in live for beam in beams]
        if not batch:
            break
        results = iter((yield [beam.tokens for beam in batch]))
        for k, beams in enumerate(live):
            extended = []
            for beam in beams:
                logprobs = next(results)
                for token, lp in candidates(logprobs, 2 * params.beam_width):
                    cum = beam.cum_logprob + lp.logprob
                    if token in eos_ids and not params.ignore_eos:
                        kept = beam.tokens + [token] if params.include_stop_str_in_output else beam.tokens
                        done[k].append(
                            BeamSearchSequence(kept, beam.logprobs + [logprobs], cum, None, "stop", token)
                        )
                    else:
                        extended.append(
                            BeamSearchSequence(beam.tokens + [token], beam.logprobs + [logprobs], cum)
                        )
            # Stable sort: equal cumulative logprobs keep the engine's order (its logprobs are ranked).
            live[k] = sorted(extended, key=lambda b: -b.cum_logprob)[: params.beam_width]
    outputs = []
    for beams, complete in zip(live, done):
        ranked = sorted(complete + beams, key=lambda b: -beam_score(b, eos_ids, params.length_penalty))
        outputs.append(BeamSearchOutput(ranked[: params.beam_width]))
    return outputs


def candidates(entry: dict[int, Logprob] | None, width2: int) -> list[tuple[int, Logprob]]:
    """The extensions of a beam that vLLM's search weighs: the sampled token (an entry's first) and the
    `width2` best. Only these, whatever else the step returned: an end-of-sequence token further down
    would otherwise end a beam that vLLM's search never saw."""
    items = list((entry or {}).items())
    return [(t, lp) for i, (t, lp) in enumerate(items) if i == 0 or lp.rank is None or lp.rank <= width2]


def run(step: Step, engine_step: Callable[[list[list[int]]], list]) -> list[BeamSearchOutput]:
    """Drive `search` synchronously: engine_step(prompts) -> each prompt's next-token logprobs."""
    try:
        batch = next(step)
        while True:
            batch = step.send(engine_step(batch))
    except StopIteration as stop:
        return stop.value


def next_token_logprobs(out: RequestOutput) -> dict[int, Logprob] | None:
    """The logprobs dict of a one-token step's output; None when it produced no token."""
    comp = out.outputs[0]
    return comp.logprobs[0] if comp.logprobs and comp.token_ids else None


def answer_logprobs(beam: BeamSearchSequence, ids: list[int], num: int) -> list[dict[int, Logprob]]:
    """Each generated token's logprobs as a sampled request with `logprobs=num` has them: the token's
    own entry first, then the `num` best of that step (the token among them or not). A stopped beam's
    end-of-sequence entry goes with the token: left out where the token is (its logprob is still in
    cum_logprob, as in vLLM's)."""
    out = []
    for token, entry in zip(ids, beam.logprobs):
        best = sorted(entry.values(), key=lambda lp: -lp.logprob)[:num]
        out.append({token: entry[token], **{lp.token_id: lp for lp in best if lp.token_id != token}})
    return out


def completion_outputs(
    beams: BeamSearchOutput, prompt_len: int, decode, logprobs: int | None = None
) -> list[CompletionOutput]:
    """The beams as a request's choices: the generated tokens (a final end-of-sequence token kept only
    where include_stop_str_in_output put it there) and their text, `finish_reason` "stop" for a beam
    that ended, "length" for one cut at max_tokens; with `logprobs` (the request's count) each token's
    logprobs (`answer_logprobs`)."""
    outs = []
    for i, beam in enumerate(beams.sequences):
        ids = beam.tokens[prompt_len:]
        text_ids = ids[:-1] if beam.finish_reason == "stop" and ids and ids[-1] == beam.stop_reason else ids
        text = decode(text_ids)
        outs.append(
            CompletionOutput(
                index=i,
                text=text,
                token_ids=ids,
                finish_reason=beam.finish_reason or "length",
                stop_reason=beam.stop_reason,
                logprobs=None if logprobs is None else answer_logprobs(beam, ids, logprobs),
                delta_text=text,
                delta_token_ids=list(ids),
                cumulative_logprob=beam.cum_logprob,
            )
        )
    return outs
