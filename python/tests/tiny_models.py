"""Tiny Hugging Face models shared by the tests that train them in the
test process and by those that train them in a process of their own (the
OpenCL plugin's, which must be the only plugin loaded): one definition
of each, so both compare the same model."""

import transformers


def llama_config(**kw):
    base = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    base.update(kw)
    return transformers.LlamaConfig(**base)


def llama(**kw):
    return transformers.LlamaForCausalLM(llama_config(**kw))


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
