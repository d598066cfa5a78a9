"""Backends that run the model elsewhere, behind the same `agent.engine.Engine` interface.

openai.py      any OpenAI-compatible server (`EngineConfig.backend = "openai"`)
vllm.py        vLLM in this process (`"vllm"`), with speculative decoding
vllm_draft.py  our MTP heads exported as vLLM's draft (`flywheel export-draft`)
"""
