"""vLLM's --enable-log-requests: one INFO line when a request arrives and one when it ends.

vLLM's RequestLogger logs "Received request <id>: params: ..." at INFO (the prompt itself only at
DEBUG); fd adds the prompt's length there, and a line when the request finishes, fails or is aborted,
so each request's life is two lines. Prompts and outputs are never logged: they may be private.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("fd.serve")


def log_received(request_id: str, params, num_prompt_tokens: int) -> None:
    logger.info(
        "Received request %s: params: %r, num_prompt_tokens: %d.", request_id, params, num_prompt_tokens
    )


def log_finished(request_id: str, item) -> None:
    if isinstance(item, BaseException):
        logger.info("Failed request %s: %s: %s.", request_id, type(item).__name__, item)
        return
    if item.pooled is not None or not item.outputs:
        logger.info("Finished request %s.", request_id)
        return
    tokens = (
        item.metrics.num_generation_tokens if item.metrics is not None else len(item.outputs[0].token_ids)
    )
    logger.info(
        "Finished request %s: finish_reason: %s, num_output_tokens: %d.",
        request_id,
        item.outputs[0].finish_reason,
        tokens,
    )


def log_aborted(request_id: str) -> None:
    logger.info("Aborted request %s.", request_id)
