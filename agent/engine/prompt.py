"""From a `Request` to the token ids a backend decodes: one place, shared by the local and vLLM
backends so that both see exactly the same prompt.

- chat messages are rendered with the tokenizer's chat template (generation prompt added);
- text is encoded as is; text read with `surrogateescape` and raw bytes are encoded byte for
  byte (agent.tokenizer.encode_bytes); other lone surrogates are refused;
- token ids are checked against the vocabulary;
- `max_tokens` is clipped to the room the context leaves; a prompt that leaves none is refused;
- the stop ids are the tokenizer's EOS, the request's own, and for chat the end of a turn.

Every problem raises `BadRequest` naming it. What it does not do: truncate prompts (callers
decide what to drop) or decode output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agent.chat_format import render_chat
from agent.engine.request import BadRequest, Request, SamplingParams
from agent.tokenizer import encode_bytes, stop_token_ids


@dataclass
class PreparedPrompt:
    ids: list[int]  # [prompt_len] token ids to prefill
    params: SamplingParams  # the request's, with max_tokens clipped to the context
    stop_ids: set[int]  # sampling one of these ends a sample
    chat: bool  # rendered from messages (output is parsed for tool calls)


def prepare_prompt(
    request: Request, tokenizer, vocab_size: int, context_length: int
) -> PreparedPrompt:
    chat = request.messages is not None
    if chat:
        try:
            text = render_chat(tokenizer, request.messages, request.tools, True)
        except Exception as exc:  # jinja and transformers raise many types
            raise BadRequest(f"could not render the chat messages: {exc}") from exc
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = encode_prompt(request.prompt, tokenizer, vocab_size)
    if not ids:
        raise BadRequest("the prompt is empty after tokenization: send at least one token")
    room = context_length - len(ids)
    if room < 1:
        raise BadRequest(
            f"the prompt has {len(ids)} tokens but the model's context is {context_length} "
            "tokens (prompt + output): shorten the prompt"
        )
    params = request.params
    if params.max_tokens > room:
        params = dataclasses.replace(params, max_tokens=room)
    bad = [t for t in params.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"stop token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    stop_ids = {tokenizer.eos_token_id, *params.stop_token_ids}
    if chat:
        stop_ids.update(stop_token_ids(tokenizer))
    return PreparedPrompt(ids, params, stop_ids, chat)


def encode_prompt(prompt: object, tokenizer, vocab_size: int) -> list[int]:
    """Text, raw bytes or token ids -> token ids."""
    if isinstance(prompt, bytes | bytearray):
        return encode_bytes(tokenizer, bytes(prompt))
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            try:  # raw bytes read with surrogateescape: encode them byte for byte
                return encode_bytes(tokenizer, prompt.encode("utf-8", "surrogateescape"))
            except UnicodeEncodeError as exc:
                raise BadRequest(
                    f"the prompt is not valid Unicode: lone surrogate {prompt[exc.start]!r} "
                    f"at character {exc.start}; send UTF-8 text"
                ) from None
        return tokenizer.encode(prompt, add_special_tokens=False)
    if isinstance(prompt, list | tuple):
        bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool)]
        if bad:
            raise BadRequest(f"token ids must be integers, got {bad[0]!r}")
        out_of_range = [t for t in prompt if not 0 <= t < vocab_size]
        if out_of_range:
            raise BadRequest(
                f"token id {out_of_range[0]} is outside the vocabulary [0, {vocab_size})"
            )
        return list(prompt)
    raise BadRequest(f"the prompt must be text or a list of token ids, not {type(prompt)}")
