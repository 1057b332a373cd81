"""Tiny random-weight models and tokenizers built in code, for tests (yours and ours).

Nothing is downloaded: the tokenizer is a byte-level BPE trained in a fraction of a second on the
agent protocol's own vocabulary, with a ChatML chat template like the default model's.
"""

from __future__ import annotations

import copy
import functools
import random
import time
from types import SimpleNamespace

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
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import
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
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import

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
    score = (sum(map(ord, response)) % 97) / 96.0
    return SimpleNamespace(reward=score, score=score, format_ok=True, format_error=None, answer=None,
                           correct=score > 0.5)


def half_uniform_reward(response: str, example: dict, **_):
    """toy_reward, except that questions containing "uniform" get 0 for every response: their groups
    have equal rewards (no signal), which DAPO's dynamic sampling drops. For tests."""
    if "uniform" in example.get("question", "").lower():
        return SimpleNamespace(reward=0.0, score=0.0, format_ok=True, format_error=None, answer=None, correct=False)
    return toy_reward(response, example)


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
    tok = copy.deepcopy(tiny_tokenizer(vocab_size))
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    return tok


def echo(text: str) -> str:
    """Return the text reversed (a plug-in tool for tests: `tools.enabled: [arpo.testing:echo]`).

    Args:
        text: what to reverse
    """
    return text[::-1]


def jitter_echo(text: str) -> str:
    """Return the text reversed after a random wait of U(0, 3 ms) (a plug-in tool for tests of
    reproducibility: `tools.enabled: [arpo.testing:jitter_echo]`). The wait comes from the OS's
    entropy, never from a seed, so the order in which results arrive differs from run to run.

    Args:
        text: what to reverse
    """
    time.sleep(random.SystemRandom().uniform(0.0, 0.003))
    return text[::-1]


# ---- the released ARPO checkpoints' architectures, tiny and random (tests of their templates) ----------
# Chat templates shaped like the real ones for the prompts arpo renders (system + user + generation
# prompt): Qwen2.5's ChatML with its default system prompt, Qwen3's ChatML (thinking on by default:
# the generation prompt is the bare assistant header), Llama 3.1's header blocks with the date lines.
QWEN25_TEMPLATE = (
    "{% if messages[0].role != 'system' %}<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
LLAMA31_TEMPLATE = (
    "<|begin_of_text|>{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}"
    "{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    "{{ sys }}<|eot_id|>{% for m in rest %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
ARCHS = ("qwen2", "qwen3", "llama")  # Qwen2.5-3B/7B-ARPO, Qwen3-8B/14B-ARPO-DeepSearch, Llama3.1-8B-ARPO


@functools.lru_cache(maxsize=4)
def arch_tokenizer(arch: str, vocab_size: int = 512):
    """A tiny byte-level BPE tokenizer with the special tokens and chat-template shape of `arch`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    llama = arch == "llama"
    specials = (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
                if llama else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    if llama:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                       pad_token="<|end_of_text|>")
        fast.chat_template = LLAMA31_TEMPLATE
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        fast.chat_template = QWEN25_TEMPLATE if arch == "qwen2" else QWEN3_TEMPLATE
    return fast


def arch_model(arch: str, tokenizer=None, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0):
    """A random-weight Qwen2ForCausalLM (Qwen2.5), Qwen3ForCausalLM (q/k norms) or LlamaForCausalLM with
    Llama 3.1's rope scaling, sized for unit tests."""
    import torch  # noqa: PLC0415 - loads torch; kept out of this light module's import
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PretrainedConfig,
        PreTrainedModel,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    tok = tokenizer or arch_tokenizer(arch)
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg: PretrainedConfig
    cls: type[PreTrainedModel]
    if arch == "qwen2":
        cfg, cls = Qwen2Config(tie_word_embeddings=True, **common), Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = Qwen3Config(head_dim=hidden // heads, tie_word_embeddings=True, **common), Qwen3ForCausalLM
    elif arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
        cfg, cls = LlamaConfig(rope_parameters=rope, tie_word_embeddings=False, **common), LlamaForCausalLM
    else:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return cls(cfg).eval()


def save_arch_model(path, arch: str, **kwargs) -> str:
    """Write a tiny random model of `arch` + its tokenizer as a Hugging Face directory (usable as --model)."""
    tok = arch_tokenizer(arch)
    arch_model(arch, tok, **kwargs).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
