"""The `local` backend: the model in torch, in this process (`engine.LocalEngine`).

engine.py            LocalEngine: a request's prefill, plain and speculative decoding
model_runner.py      the loaded weights (trunk, MTP heads, tokenizer) and their forward pass
batched.py           several requests' steps in one forward pass, each on its own cache
kv_cache.py          the KV cache: crop rejected drafts, keep a tree's accepted branch
prefix_cache.py      computed prompt prefixes, reused by the next turn or sample
proposers.py         drafts: n-gram lookup, MTP heads, a draft model
rejection_sampler.py which drafts the target keeps (greedy and sampled, lossless)
sampling.py          sampling from logits (temperature, top-p, top-k), logprobs
tool_grammar.py      the tool-call grammar a chat request with tools decodes under
copy_bias.py         fast apply's logit bonus for copying its sources
few_rows.py          linear layers for decode-sized products on the CPU
lowbit.py            int8 and int4 weights for decoding on the CPU
cpu_kernels.py/.c    Flywheel's CPU kernels (int8 products, attention), compiled on first use
"""
