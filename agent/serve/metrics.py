"""`GET /metrics`: Prometheus counters of one server (requests, tokens, speculative decoding).

prometheus_client is imported when a server is built, not when `flywheel serve --help` runs.
"""

import threading

from agent.engine import RequestMetrics


class ServerMetrics:
    """Prometheus counters for one server (its own registry, so tests can run several)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "flywheel_requests",
            "HTTP requests by route and status code",
            ["route", "status"],
            registry=r,
        )
        self.cancelled = Counter(
            "flywheel_requests_cancelled", "requests cancelled by a client disconnect", registry=r
        )
        self.running = Gauge("flywheel_requests_running", "requests being generated", registry=r)
        self.prompt_tokens = Counter("flywheel_prompt_tokens", "prompt tokens", registry=r)
        self.cached_tokens = Counter(
            "flywheel_prefix_cache_hit_tokens",
            "prompt tokens read from the prefix cache instead of prefilled",
            registry=r,
        )
        self.output_tokens = Counter("flywheel_generation_tokens", "generated tokens", registry=r)
        self.drafts_proposed = Counter(
            "flywheel_spec_decode_draft_tokens", "draft tokens proposed to the verifier", registry=r
        )
        self.drafts_accepted = Counter(
            "flywheel_spec_decode_accepted_tokens", "draft tokens the verifier kept", registry=r
        )
        self.verify_steps = Counter(
            "flywheel_spec_decode_verify_steps", "target-model passes over drafts", registry=r
        )
        self.mean_acceptance = Gauge(
            "flywheel_spec_decode_mean_acceptance_length",
            "tokens emitted per verify step over the server's life (accepted + 1)",
            registry=r,
        )
        self.ttft = Histogram(
            "flywheel_time_to_first_token_seconds",
            "time to first token",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.model_info = Gauge(
            "flywheel_model_info", "the model version new requests use", ["version"], registry=r
        )
        self._lock = threading.Lock()
        self._accepted = self._steps = 0

    def record(self, m: RequestMetrics) -> None:
        self.prompt_tokens.inc(m.prompt_tokens)
        self.cached_tokens.inc(m.cached_tokens)
        self.output_tokens.inc(m.output_tokens)
        self.drafts_proposed.inc(m.drafts_proposed)
        self.drafts_accepted.inc(m.drafts_accepted)
        self.verify_steps.inc(m.verify_steps)
        if m.output_tokens:
            self.ttft.observe(m.ttft_s)
        with self._lock:
            self._accepted += m.drafts_accepted
            self._steps += m.verify_steps
            if self._steps:
                self.mean_acceptance.set((self._accepted + self._steps) / self._steps)

    def render(self, version: str) -> bytes:
        from prometheus_client import generate_latest

        self.model_info.clear()
        self.model_info.labels(version=version).set(1)
        return generate_latest(self.registry)
