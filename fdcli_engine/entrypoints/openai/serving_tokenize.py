"""POST /tokenize and /detokenize, framework-free: text or messages → token ids, and back."""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.chat_images import image_refs
from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.serving_common import check_model, encode, off_loop


class OpenAIServingTokenization:
    def __init__(self, engine, served_model_names: list[str], chat: OpenAIServingChat):
        self.engine = engine
        self.served_model_names = served_model_names
        self.chat = chat  # renders messages with the server's chat template

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        check_model(req.model, self.served_model_names)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages", "prompt")
        if req.prompt is not None:
            tokens = await off_loop(encode, self.engine.tokenizer, req.prompt, req.add_special_tokens)
        else:
            chat_req = ChatCompletionRequest(
                messages=req.messages, add_generation_prompt=req.add_generation_prompt, tools=req.tools
            )
            refs = image_refs(req.messages)
            images = await self.chat.images.load(refs)  # counted as a chat request expands them
            tokens = (await off_loop(self.chat.render, chat_req))[1]
            if images:
                tokens, _ = await off_loop(self.chat.images.expand, tokens, images, None, refs[0].param)
        return TokenizeResponse(
            count=len(tokens),
            max_model_len=self.engine.model_config.max_model_len,
            tokens=tokens,
            token_strs=self.engine.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None,
        )

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        check_model(req.model, self.served_model_names)
        vocab = self.engine.model_config.vocab_size
        if vocab and req.tokens and max(req.tokens) >= vocab:
            raise bad_request(
                f"token id {max(req.tokens)} is outside the vocabulary (size {vocab})", "tokens"
            )
        # Special tokens are kept, as vLLM's /detokenize keeps them: /tokenize → /detokenize gives the
        # rendered prompt back (`<|im_start|>user\nhi<|im_end|>`), not just its words.
        return DetokenizeResponse(prompt=self.engine.tokenizer.decode(req.tokens, skip_special_tokens=False))
