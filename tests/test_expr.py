from nanocompile.ir.expr import PAST, SEQ, Expr, product


def test_polynomial_arithmetic_is_structural():
    a = 3 * SEQ + PAST + 2
    assert a - PAST - 2 == 3 * SEQ
    assert (SEQ * PAST) == (PAST * SEQ)
    assert (SEQ + 1) * (SEQ - 1) == SEQ * SEQ - 1
    assert hash(SEQ + PAST) == hash(PAST + SEQ)
    assert Expr.of(5).is_const and not a.is_const


def test_evaluate_and_coefficients():
    p = 5376 * PAST * SEQ + 24576 * PAST + 7
    assert p.evaluate({"seq": 2, "past": 10}) == 5376 * 20 + 245760 + 7
    assert p.coeff("seq", "past") == 5376 and p.coeff("past") == 24576 and p.const == 7
    assert product([SEQ, 14, 64]) == 896 * SEQ


def test_printing():
    assert str(PAST + SEQ) == "past + seq"
    assert str(2 * SEQ - 1) == "2*seq - 1"
    assert str(Expr.of(0)) == "0"
    assert str(SEQ * PAST * 3 + 4) == "3*past*seq + 4"


def test_rejects_non_integers():
    import pytest
    for bad in (1.5, True, "seq"):
        with pytest.raises(TypeError):
            Expr.of(bad)
    with pytest.raises(ValueError):
        Expr.sym("batch")
