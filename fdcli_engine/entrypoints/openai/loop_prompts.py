"""Which prompts are made on the event loop instead of a prepare worker (serving_common.off_loop).

Templating and tokenization go to a worker so that a large prompt delays only its own request. A small
one is cheaper on the loop: its encode (~0.4 ms for 512 tokens, ~1 ms at LOOP_ENCODE_CHARS on a server
core) costs less than the hop to the worker and the GIL hand-offs around it (the worker's wake-up, the
loop's next ZMQ send waiting for the GIL while the worker winds down). So token ids, one completion text
of at most LOOP_ENCODE_CHARS characters, and the server's own chat template over a few plain text
messages of that size in all are made on the loop; anything else, whatever its size, on a worker.
"""

from __future__ import annotations

LOOP_ENCODE_CHARS = 8192  # the most characters of prompt text tokenized on the loop
LOOP_CHAT_MESSAGES = 16  # the most messages a chat prompt rendered on the loop holds


def has_text(prompt) -> bool:
    """Whether a validated completion prompt (text | [text] | ids | [ids]) holds text to tokenize."""
    if isinstance(prompt, str):
        return True
    return bool(prompt) and not isinstance(prompt[0], int) and any(isinstance(p, str) for p in prompt)


def prepared_on_loop(prompt) -> bool:
    """Whether a validated completion prompt is tokenized on the loop: token ids, or one text of at most
    LOOP_ENCODE_CHARS characters (a list of texts, however short each, goes to a worker)."""
    return not has_text(prompt) or (isinstance(prompt, str) and len(prompt) <= LOOP_ENCODE_CHARS)


def chat_on_loop(req, images) -> bool:
    """Whether a validated chat request's prompt is made on the loop: its own token ids, or the server's
    template over at most LOOP_CHAT_MESSAGES text messages of LOOP_ENCODE_CHARS characters in all. A
    request template, template arguments, tools, documents, images, tool calls or reasoning in the
    messages send it to a worker."""
    if req.prompt_token_ids is not None:
        return True
    if images or req.chat_template is not None or req.chat_template_kwargs or req.tools or req.documents:
        return False
    if len(req.messages) > LOOP_CHAT_MESSAGES:
        return False
    chars = 0
    for m in req.messages:
        if not isinstance(m.content, str) or m.tool_calls or m.reasoning_content:
            return False
        chars += len(m.content)
    return chars <= LOOP_ENCODE_CHARS
