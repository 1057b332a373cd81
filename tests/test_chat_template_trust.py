"""A run directory's chat template is data (issue 61, crossing 2).

The tokenizer of a run carries Jinja written by whoever made the run; `arpo chat / eval / serve agent`
rendered it for every prompt, unbounded (`'x' * 10**9`: 4.7 GB; nested range loops: no end). Without
--trust-run-config the base model's template or arpo's named one is used (one line says which); with
the flag the run's renders in a process with bounded memory and time."""

import time

import pytest
import yaml

from arpo.chat_templates import CHATML, BoundedRenderer, guard_tokenizer
from arpo.cli import main
from arpo.errors import ArpoError

MARK = "{{ raise_exception('the run template ran') }}"
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]


def make_run(tmp_path, template: str, base: str | None = None):
    from arpo.testing import save_tiny_model

    run = tmp_path / "run"
    model = run / "checkpoints" / "step_000001" / "model"
    save_tiny_model(model)
    (model.parent / "state.json").write_text('{"step": 1}')
    cfg = {"data": {"template": "math"}, "tools": {"enabled": ["python"]}}
    if base:
        cfg["model"] = {"name": base}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = template
    tok.save_pretrained(model)
    return run


def test_chat_of_a_run_does_not_render_its_template_without_the_flag(tmp_path, capsys):
    run = make_run(tmp_path, MARK)
    assert main(["chat", "--model", str(run), "--max-response-tokens", "2", "hi"]) == 0
    err = capsys.readouterr().err
    assert "the run's chat template is not used" in err and "using arpo's chatml template" in err, err
    assert "the run template ran" not in err


def test_the_base_models_template_is_used_when_it_is_here(tmp_path, capsys):
    from transformers import AutoTokenizer

    from arpo.testing import save_tiny_model

    base = tmp_path / "base"
    save_tiny_model(base)
    t = AutoTokenizer.from_pretrained(base)
    t.chat_template = CHATML.replace("'\\n'}}", "'\\n'}}BASE")
    t.save_pretrained(base)
    run = make_run(tmp_path, MARK, base=str(base))
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000001" / "model")
    guard_tokenizer(tok, str(run), False, "eval")
    assert "using the base model's" in capsys.readouterr().err
    assert tok.apply_chat_template(MSGS, tokenize=False).count("BASE") == 2


def test_a_run_whose_template_is_its_base_models_keeps_it_and_other_models_are_untouched(tmp_path, capsys):
    from transformers import AutoTokenizer

    from arpo.testing import save_tiny_model

    base = tmp_path / "base"
    save_tiny_model(base)
    run = make_run(tmp_path, AutoTokenizer.from_pretrained(base).chat_template, base=str(base))
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000001" / "model")
    own = tok.apply_chat_template
    guard_tokenizer(tok, str(run), False, "chat")
    guard_tokenizer(t2 := AutoTokenizer.from_pretrained(base), str(base), False, "chat")
    assert tok.apply_chat_template == own and t2.chat_template is not None and capsys.readouterr().err == ""


def test_no_template_to_fall_back_on_names_the_flag(tmp_path):
    from transformers import AutoTokenizer

    run = make_run(tmp_path, MARK)
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000001" / "model")
    tok.get_vocab = lambda: {}  # a family arpo has no template for
    with pytest.raises(ArpoError, match="--trust-run-config"):
        guard_tokenizer(tok, str(run), False, "chat")


@pytest.fixture()
def trusted_tok(tmp_path):
    from transformers import AutoTokenizer

    run = make_run(tmp_path, CHATML)
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000001" / "model")
    want = tok.apply_chat_template(MSGS, add_generation_prompt=True)
    guard_tokenizer(tok, str(run), True, "chat")
    yield tok, want
    tok._arpo_renderer.close()


def test_with_the_flag_the_template_renders_the_same_in_its_own_process(trusted_tok):
    tok, want = trusted_tok
    assert list(tok.apply_chat_template(MSGS, add_generation_prompt=True, return_dict=False)) == list(want["input_ids"])
    assert tok.apply_chat_template(MSGS, tokenize=False).startswith("<|im_start|>system\nbe brief")
    batch = tok.apply_chat_template([MSGS, MSGS[1:]], tokenize=False)
    assert isinstance(batch, list) and len(batch) == 2


def test_with_the_flag_a_memory_bomb_is_a_one_line_error(trusted_tok):
    tok, _ = trusted_tok
    tok.chat_template = "{{ 'x' * 2000000000 }}"
    t0 = time.monotonic()
    with pytest.raises(ArpoError, match="MiB"):
        tok.apply_chat_template(MSGS, tokenize=False)
    assert time.monotonic() - t0 < 60
    tok.chat_template = CHATML  # the renderer goes on
    assert tok.apply_chat_template(MSGS, tokenize=False).startswith("<|im_start|>")


def test_with_the_flag_a_template_that_never_ends_is_stopped(tmp_path):
    from transformers import AutoTokenizer

    run = make_run(tmp_path, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000001" / "model")
    r = BoundedRenderer.install(tok, BoundedRenderer(timeout_s=2.0))
    try:
        r.render({"conversations": [MSGS], "template": CHATML})  # started (its imports are not the render's time)
        t0 = time.monotonic()
        with pytest.raises(ArpoError, match="did not render within 2 s"):
            tok.apply_chat_template(MSGS, tokenize=False)
        assert time.monotonic() - t0 < 10
        tok.chat_template = CHATML
        assert tok.apply_chat_template(MSGS, tokenize=False).startswith("<|im_start|>")
    finally:
        r.close()
