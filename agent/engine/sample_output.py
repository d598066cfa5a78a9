"""One sample's output as it grows: incremental text, stop tokens, stop strings, max tokens.

Tokens arrive one at a time (`add`). Text is decoded incrementally from each token's exact bytes,
so a character split over several byte tokens appears once it is complete. Stop conditions:

- a stop token id (EOS, `<|im_end|>` for chat, the request's own): the token is kept in `token_ids`
  and `logprobs` (it was sampled) but contributes no text;
- a stop string: the text is cut where the first stop string begins (it may span several
  tokens), at or after character `stop_after`; the token that completed it is the last one kept;
- `max_tokens` reached: finish reason "length".

Streaming (`delta`) never emits text that could still turn out to be the start of a stop string:
a suffix of the text that is a prefix of some stop string is held back until resolved.
"""

from __future__ import annotations

import codecs

from agent.engine.request import Completion, Delta, FinishReason, SamplingParams


def first_stop(text: str, stop_strings: list[str], start: int) -> int | None:
    """Where the first stop string found at or after `start` of `text` begins (None: none)."""
    cuts = [i for s in stop_strings if (i := text.find(s, start)) >= 0]
    return min(cuts) if cuts else None


class SampleOutput:
    def __init__(
        self,
        index: int,
        token_bytes: list[bytes],
        stop_ids: set[int],
        stop_strings: list[str],
        max_tokens: int,
        logprobs: bool,
        stop_after: int = 0,
    ) -> None:
        self.index = index
        self.stop_after = stop_after
        self.token_bytes = token_bytes
        self.stop_ids = stop_ids
        self.stop_strings = stop_strings
        self.max_tokens = max_tokens
        self.token_ids: list[int] = []
        self.logprobs: list[float] | None = [] if logprobs else None
        self.text = ""
        self.finish_reason: FinishReason | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._longest_stop = max((len(s) for s in stop_strings), default=0)
        self._sent_text = 0  # characters of `text` already streamed
        self._sent_tokens = 0  # tokens already streamed
        self._sent_final = False  # the delta carrying finish_reason has gone out

    @classmethod
    def for_request(
        cls, index: int, token_bytes: list[bytes], stop_ids: set[int], params: SamplingParams
    ) -> SampleOutput:
        """Sample `index` of a request with `params` (its stop strings, budget and logprobs)."""
        return cls(
            index,
            token_bytes,
            stop_ids,
            params.stop,
            params.max_tokens,
            params.logprobs,
            params.stop_after,
        )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int, logprob: float | None) -> bool:
        """Append one sampled token; returns True when the sample is finished."""
        if self.finished:
            return True
        self.token_ids.append(token)
        if self.logprobs is not None:
            self.logprobs.append(float(logprob) if logprob is not None else 0.0)
        if token in self.stop_ids:
            self.finish("stop")
            return True
        before = len(self.text)
        piece = self.token_bytes[token] if 0 <= token < len(self.token_bytes) else b""
        self.text += self._decoder.decode(piece)
        if self.stop_strings and len(self.text) > before:
            start = max(self.stop_after, before - self._longest_stop + 1)
            cut = first_stop(self.text, self.stop_strings, start)
            if cut is not None:
                self.text = self.text[:cut]
                self.finish_reason = "stop"
                return True
        if len(self.token_ids) >= self.max_tokens:
            self.finish("length")
        return self.finished

    def finish(self, reason: FinishReason) -> None:
        if self.finished:
            return
        self.text += self._decoder.decode(b"", final=True)
        self.finish_reason = reason

    def delta(self) -> Delta | None:
        """What is new since the last delta (None when nothing is), holding back stop prefixes."""
        if self._sent_final:
            return None
        end = len(self.text) if self.finished else len(self.text) - self._held_back()
        end = max(end, self._sent_text)
        new_tokens = self.token_ids[self._sent_tokens :]
        if end == self._sent_text and not new_tokens and not self.finished:
            return None
        delta = Delta(
            index=self.index,
            text=self.text[self._sent_text : end],
            token_ids=new_tokens,
            logprobs=None if self.logprobs is None else self.logprobs[self._sent_tokens :],
            finish_reason=self.finish_reason,
        )
        self._sent_text = end
        self._sent_tokens = len(self.token_ids)
        self._sent_final = self.finished
        return delta

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        text = self.text
        for size in range(min(self._longest_stop - 1, len(text) - self._sent_text), 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return size
        return 0

    def completion(self, model_version: str) -> Completion:
        return Completion(
            text=self.text,
            token_ids=list(self.token_ids),
            logprobs=None if self.logprobs is None else list(self.logprobs),
            finish_reason=self.finish_reason or "length",
            index=self.index,
            model_version=model_version,
        )
