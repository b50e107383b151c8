"""Stop rules: EOS handling and stop-string matching on decoded tails with the real tokenizer
(multi-byte characters split across byte-level tokens included)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from loraplex.domain.sampling import StopCondition
from loraplex.engine.sampling.stop_rule import StopRule, StopStringMatcher


def test_eos_joins_the_stop_ids_unless_stop_is_an_empty_list() -> None:
    assert StopRule.of(StopCondition(), (7, 8)).token_ids == {7, 8}
    assert StopRule.of(StopCondition(token_ids=(3,)), (7,)).token_ids == {3, 7}
    assert StopRule.of(StopCondition(use_eos=False), (7,)).token_ids == set()


def test_a_stop_string_is_found_when_its_last_token_arrives(tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = "The answer is 42. Done — naïve café ☃ end"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    matcher = StopStringMatcher(tiny_model_dir)
    assert matcher.is_available
    for stop in ("42.", "café ☃", "☃", " end"):
        rule = StopRule.of(StopCondition(strings=(stop,)), ())
        hits = [matcher.matches([ids[:i]], [rule])[0] for i in range(1, len(ids) + 1)]
        first = next(i for i in range(1, len(ids) + 1)
                     if stop in tokenizer.decode(ids[:i], skip_special_tokens=False))
        assert hits.index(True) + 1 == first, stop


def test_without_a_tokenizer_stop_strings_are_unavailable(tmp_path: Path) -> None:
    assert not StopStringMatcher(tmp_path).is_available
