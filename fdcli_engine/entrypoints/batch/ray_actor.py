"""One Ray actor of `fd run-batch --distributed-executor-backend ray`: one in-process engine and the
serving layer over it, answering lists of batch lines with their records.

Plain class: the driver makes it a Ray actor (`ray.remote(BatchEngineActor)`), so importing this module
does not import Ray. Everything that crosses to and from the actor is JSON text (the resolved config,
the serving options, the lines, the records): Ray moves strings, never fd's own objects.

Invariants:
- A line is answered exactly as the single-process run answers it: the same envelope parsing
  (`parse_line`), the same serving layer and the same per-line error records (`serve_line`).
- A dead engine is not a line error: `run_lines` raises, and the driver treats the actor as failed
  (its lines are retried on another actor).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

from fdcli_engine.entrypoints.batch.dispatcher import serve_line
from fdcli_engine.entrypoints.batch.records import dump_record, parse_line
from fdcli_engine.entrypoints.openai.routes import BATCH_ROUTES
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.threads import BIND_ENV


def encode_lines(lines: list[tuple[int, str, str, dict]]) -> str:
    """The driver's side of `run_lines`' input: (line number, custom_id, url, body) per line."""
    return json.dumps(lines, ensure_ascii=False)


class BatchEngineActor:
    def __init__(self, config_json: str, served_model_name: str, serving_json: str, num_threads: int):
        from fdcli_engine.api.inproc_client import InProcessEngineClient
        from fdcli_engine.entrypoints.openai.serving_layer import build_serving
        from fdcli_engine.resolved_config import ResolvedConfig
        from fdcli_engine.tokenizer import load_tokenizer

        # Several actors may share a node and Ray does not tell them which CPUs are theirs: binding the
        # OpenMP threads to CPUs 0..n-1 would put every actor on the same cores.
        os.environ[BIND_ENV] = "nobind"
        config = ResolvedConfig.from_json(config_json).replace(
            num_threads=num_threads, threads=num_threads, data_parallel_size=1, data_parallel_rank=0
        )
        self.engine = InProcessEngineClient(
            config, load_tokenizer(config), served_model_name=served_model_name
        )
        self.serving = build_serving(self.engine, ServingOptions(**json.loads(serving_json)))

    def where(self) -> dict:
        """This actor's process and host (the driver prints them: what to look at when one dies)."""
        return {"pid": os.getpid(), "host": socket.gethostname()}

    async def run_lines(self, lines_json: str) -> list[str]:
        """The output record (one JSON line each) of every line, in the order given."""

        async def one(line_no: int, custom_id: str, url: str, body: dict) -> str:
            raw = json.dumps({"custom_id": custom_id, "url": url, "body": body}).encode()
            line = parse_line(line_no, raw, BATCH_ROUTES)
            return dump_record(await serve_line(self.serving, BATCH_ROUTES, line))

        return list(await asyncio.gather(*(one(*item) for item in json.loads(lines_json))))

    async def stop(self) -> None:
        await self.engine.shutdown()
