"""Tiny random-weight models and tokenizers built in code, for tests (yours and ours).

Nothing is downloaded: the tokenizer is a byte-level BPE trained in a fraction of a second on the
agent protocol's own vocabulary, with a ChatML chat template like the default model's.
"""

from __future__ import annotations

import functools

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "<think> I need to compute this. </think> <python> print(17 * 23) </python> <result> 391 </result>",
    "<search> capital of France </search> <result> Page 1: Paris\n Paris is the capital. </result>",
    "<answer> The answer is \\boxed{391} </answer> What is 2 + 2? Use python. The result is 4.",
    "def f(x): return x * 2\nfor i in range(10): print(i)\nimport math\nmath.sqrt(16)",
    "Question: Who wrote Hamlet? William Shakespeare wrote it in 1600. yes no maybe",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 +-*/=()[]{}<>.,;:!?'\"#$%&_|~^`@\\",
]


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(vocab_size: int = 512):
    """A PreTrainedTokenizerFast with ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_model(tokenizer=None, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, dtype=None):
    """A random-weight LlamaForCausalLM (the default model's architecture) sized for unit tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def hook_rollout(rollout, hook) -> None:
    """Make every sequence an ARPORollout (or anything with an AgentLoop `.loop`) starts sample through
    `hook` (see scripted_hook); forks inherit their parent's params, hence the hook."""
    base = rollout.loop.params

    def params(n, seed):
        p = base(n, seed)
        p.logits_hook = hook
        return p

    rollout.loop.params = params


def scripted_hook(tokenizer, segments: list[str], eos_after: bool = True, free_tokens: int = 0):
    """A logits hook that makes any model write `segments[k]` as its k-th generated segment (segments
    are separated by appended tool results), then EOS. Lets protocol tests run a real engine with
    exact, known outputs.

    With `free_tokens = n`, each segment starts with n tokens sampled from the model itself, at a
    sharpness that varies pseudo-randomly with the sequence so far (so entropies, and ARPO's branch
    decisions, vary); then the scripted text follows."""
    import torch

    targets = [tokenizer.encode(s, add_special_tokens=False) for s in segments]
    banned = ([tokenizer.eos_token_id] + [i for i in range(len(tokenizer))
                                          if "<" in tokenizer.decode([i]) or ">" in tokenizer.decode([i])]
              if free_tokens else [])

    def hook(seq, logits):
        mask = seq.gen_mask
        k = sum(1 for i in range(len(mask)) if mask[i] == 0 and (i + 1 == len(mask) or mask[i + 1] == 1))
        pos = 0
        while pos < len(mask) and mask[len(mask) - 1 - pos] == 1:
            pos += 1
        if free_tokens and k < len(targets) and pos < free_tokens:
            h = (sum(seq.tokens) * 2654435761 + len(seq.tokens) * 40503) % 1000 / 1000.0
            out = logits * (0.2 + 8.0 * h * h)
            out[banned] = float("-inf")
            return out
        pos -= free_tokens if k < len(targets) else 0
        if k < len(targets) and pos < len(targets[k]):
            t = targets[k][pos]
        elif eos_after:
            t = tokenizer.eos_token_id
        else:
            return logits
        forced = torch.full_like(logits, float("-inf"))
        forced[t] = 0.0
        return forced

    return hook


def toy_reward(response: str, example: dict, **_):
    """A reward for tests with tiny random models (which never follow the protocol): varies with the
    response so advantages are non-zero. Returns the same fields as arpo.rewards.RewardResult."""
    from types import SimpleNamespace

    score = (sum(map(ord, response)) % 97) / 96.0
    return SimpleNamespace(reward=score, score=score, format_ok=True, format_error=None, answer=None,
                           correct=score > 0.5)


def save_tiny_model(path, **kwargs) -> str:
    """Write a tiny random model + tokenizer as a Hugging Face directory (usable as --model)."""
    tok = tiny_tokenizer()
    model = tiny_model(tok, **kwargs)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


# A Qwen2.5-style chat template with native tool calling (hermes <tool_call> / <tool_response>),
# for tests of `agent.tool_format: json` without downloading a Qwen tokenizer.
QWEN_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system{{ '\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
    " XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system{{ '\\n' }}"
    "{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for tc in message.tool_calls %}{{ '\\n' }}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_style_tokenizer(vocab_size: int = 512):
    """tiny_tokenizer with the Qwen-style tool-calling chat template above."""
    import copy

    tok = copy.deepcopy(tiny_tokenizer(vocab_size))
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    return tok


def echo(text: str) -> str:
    """Return the text reversed (a plug-in tool for tests: `tools.enabled: [arpo.testing:echo]`).

    Args:
        text: what to reverse
    """
    return text[::-1]
