"""The sampler against what each of its stages means, on small logit vectors."""
import numpy as np
import pytest

from nanocompile.engine.sampling import Sampler, SamplingParams
from nanocompile.errors import InputError

LOGITS = np.array([1.0, 3.0, 2.5, -1.0, 0.0], np.float32)


def _draws(params, n=4000, logits=LOGITS):
    s = Sampler(params)
    return np.bincount([s(logits) for _ in range(n)], minlength=len(logits))


def test_greedy_forms_pick_the_largest_logit():
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=-1), SamplingParams(top_k=1, seed=3),
                   SamplingParams(min_p=1.0, seed=3)):
        assert set(np.nonzero(_draws(params, 50))[0]) == {1}, params


def test_greedy_reads_the_float32_logits_as_the_float64_path_does():
    """Greedy without penalties skips the float64 copy: the same token on logits with ties (the
    first of equal maxima) and extremes; with a penalty it takes the float64 path."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        logits = rng.integers(-4, 5, 1000).astype(np.float32) * np.float32(1e37)  # many ties, near the top
        greedy = Sampler(SamplingParams(temperature=0))
        assert greedy(logits) == int(np.argmax(logits.astype(np.float64))) == int(np.flatnonzero(logits == logits.max())[0])
    penalized = Sampler(SamplingParams(temperature=0, repeat_penalty=4.0))
    penalized.accept([1])
    assert penalized(LOGITS) == 2  # 3.0 / 4 falls below 2.5
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=4.0))(LOGITS) == 1  # nothing remembered yet


@pytest.mark.slow
def test_draws_follow_the_tempered_distribution():
    logits = np.array([0.0, np.log(3.0)], np.float32)
    counts = _draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7), 8000, logits)
    assert abs(counts[1] / 8000 - 0.75) < 5 * np.sqrt(0.75 * 0.25 / 8000)
    counts = _draws(SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, seed=7), 8000, logits)
    assert abs(counts[1] / 8000 - 0.9) < 5 * np.sqrt(0.9 * 0.1 / 8000)  # 3^2 : 1


@pytest.mark.slow
def test_top_k_top_p_min_p_cut_the_tail():
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    assert set(np.nonzero(_draws(SamplingParams(**{**base, "top_k": 2})))[0]) == {1, 2}
    # probabilities at temperature 1: 3.0 -> 0.52, 2.5 -> 0.32, 1.0 -> 0.07, ...: 0.8 needs the first two
    assert set(np.nonzero(_draws(SamplingParams(**{**base, "top_p": 0.8})))[0]) == {1, 2}
    assert set(np.nonzero(_draws(SamplingParams(**{**base, "min_p": 0.5})))[0]) == {1, 2}
    assert len(np.nonzero(_draws(SamplingParams(**base)))[0]) == 5


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    s.accept([1])
    assert s(LOGITS) == 2  # 3.0 / 2 = 1.5 < 2.5
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=1))
    s.accept([1, 4])  # only the last token is remembered
    assert s(LOGITS) == 1


def test_same_seed_same_tokens():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=99)
    assert np.array_equal(_draws(params, 200), _draws(params, 200))
    a, b = Sampler(params), Sampler(params)
    assert [a(LOGITS) for _ in range(50)] == [b(LOGITS) for _ in range(50)]
    assert Sampler(SamplingParams(seed=-1)).seed >= 0


@pytest.mark.parametrize("bad, message", [(dict(top_p=0.0), "--top-p"), (dict(min_p=-0.1), "--min-p"),
                                          (dict(top_k=-2), "--top-k"), (dict(repeat_penalty=0.0), "--repeat-penalty"),
                                          (dict(repeat_last_n=-1), "--repeat-last-n"), (dict(seed=-7), "--seed")])
def test_bad_parameters_are_named(bad, message):
    with pytest.raises(InputError, match=message):
        Sampler(SamplingParams(**bad))


def test_frequency_and_presence_penalties_subtract_as_llama_cpp_does():
    # logit - count * frequency - presence, over the remembered tokens: 3.0 - 2 * 0.3 - 0.0 = 2.4 < 2.5
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.3))
    s.accept([1, 1])
    assert s(LOGITS) == 2
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.3))
    s.accept([1])  # 3.0 - 0.3 = 2.7 > 2.5
    assert s(LOGITS) == 1
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.6))
    s.accept([1])  # 3.0 - 0.6 = 2.4 < 2.5, however often it occurred
    assert s(LOGITS) == 2


def test_extreme_temperatures_and_penalties_overflow_into_a_choice_not_a_failure():
    # found by fuzzing the server: logits overflowed to infinity, and the softmax made NaN of them
    free = dict(top_k=0, top_p=1.0, min_p=0.0, seed=2)
    assert set(np.nonzero(_draws(SamplingParams(temperature=5e-324, **free), 50))[0]) == {1}  # greedy
    for temperature in (0.8, 2.0):
        s = Sampler(SamplingParams(temperature=temperature, repeat_penalty=5e-324, **free))
        s.accept([1, 2])  # 3.0 and 2.5 divided by 5e-324: both infinite, so both the largest
        assert {s(LOGITS) for _ in range(50)} <= {1, 2}
    s = Sampler(SamplingParams(temperature=1.0, repeat_penalty=1e308, **free))
    s.accept([1, 2, 3])  # -1.0 times 1e308: never drawn
    assert 3 not in {s(LOGITS) for _ in range(50)}  # (before it leaves the last 64 tokens)


def test_a_shared_generator_continues_its_sequence():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    one = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    want = [one(LOGITS) for _ in range(40)]
    rng = np.random.default_rng(5)
    a, b = Sampler(params, rng=rng), Sampler(params, rng=rng)
    assert [a(LOGITS) for _ in range(20)] + [b(LOGITS) for _ in range(20)] == want


def test_parameters_are_named_as_the_api_names_them():
    with pytest.raises(InputError, match=r"^top_p must be in \(0, 1\]"):
        SamplingParams(top_p=2.0).check(flag_names=False)
    with pytest.raises(InputError, match="^temperature must be a finite number"):
        SamplingParams(temperature=float("nan")).check(flag_names=False)
    with pytest.raises(InputError, match="^--temp must be a finite number"):
        SamplingParams(temperature=float("inf")).check()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 7, 151935])
def test_one_non_finite_logit_anywhere_is_refused(bad, where):
    from nanocompile.engine.stream import check_finite
    from nanocompile.errors import NonFiniteLogitsError

    logits = np.random.default_rng(where).standard_normal(151936).astype(np.float32)
    assert check_finite(logits, 1, "a step") is logits
    logits[where] = bad
    with pytest.raises(NonFiniteLogitsError, match=f"{int(np.isnan(bad))} NaN and {int(np.isinf(bad))} infinite"):
        check_finite(logits, 1, "a step")
