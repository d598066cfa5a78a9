"""`flywheel serve`: an OpenAI-compatible HTTP server over any engine backend.

    flywheel serve --model path/to/checkpoint --speculative ngram --port 8000
    curl http://127.0.0.1:8000/v1/completions -d '{"prompt": "def add(a, b):", "max_tokens": 32}'

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (both with SSE
streaming; chat with tools and tool calls in OpenAI's wire shape), `GET /metrics` (Prometheus text:
requests, tokens, speculative-decoding counters) and `GET /health`. With `--api-key`, every route
but `/health` needs `Authorization: Bearer KEY`. It binds 127.0.0.1 unless told otherwise.

Beyond OpenAI's fields, requests may carry `speculation` (text the output should resemble, e.g. the
original file of an apply request), `apply` (chat: true for a fast-apply conversation, which the
model's fast-apply adapter decodes where its folder has one), `top_k`, `stop_token_ids` and
`return_token_ids` (vLLM's name: adds `token_ids` to each choice). Responses add `metrics` (the
engine's `RequestMetrics`) beside `usage`, `system_fingerprint` is the version of the weights that
wrote the answer, and `/v1/models` entries carry `max_model_len`, `version` and, for a model
completion RL fitted one, `show_min_confidence` (agent/confidence.py): a language server using
this server as its model withholds inline suggestions under it, as with the folder. Logprob tokens
are named `token_id:N` (vLLM's `return_tokens_as_token_ids` convention) because the engine
interface speaks token ids, not token strings.

Bad requests get OpenAI-style JSON errors with status 400 and a message naming the problem; engine
failures get 500; neither stops the server. The engine's blocking calls run in worker threads, and a
client that disconnects cancels its request (`Request.cancel`).

Not here: several prompts in one request (send one request per prompt; `n` samples are fine),
penalties and `logit_bias` (rejected with 400), embeddings, swapping weights over HTTP.

`--model registry` serves the promoted version of the model registry (agent/registry.py) and
follows it: a promotion or rollback is picked up within `--reload-interval` seconds, and before
the next request at the latest; requests already running finish on the old weights. Only a
version whose files verify against its manifest is loaded. `--lane completion` serves and
follows the version serving the editor's completions instead (the promoted one until a
completion version is promoted).

Files, one role each:
- `request_body.py`  request JSON -> engine `Request`, every field checked (400 on a bad one)
- `response_body.py` engine `Result` / `Delta` -> response JSON and SSE chunks, error bodies
- `metrics.py`       the Prometheus counters behind `/metrics`
- `routes.py`        the routes: API key, worker threads, streaming, errors as JSON bodies
- `app.py`           `ServerConfig`, a streamed request's life (`StreamJob`), `build_app`
- `cli.py`           `flywheel serve`: flags, the listening socket, the engine, uvicorn
"""

from agent.serve.app import ServerConfig, StreamJob, build_app
from agent.serve.cli import main
from agent.serve.metrics import ServerMetrics
from agent.serve.request_body import chat_request, completion_request, parse_body, sampling_params
from agent.serve.response_body import ChatContent, ResponseShape, chat_content, error_body

__all__ = [
    "ChatContent",
    "ResponseShape",
    "ServerConfig",
    "ServerMetrics",
    "StreamJob",
    "build_app",
    "chat_content",
    "chat_request",
    "completion_request",
    "error_body",
    "main",
    "parse_body",
    "sampling_params",
]
