"""The shared number filters (studio/templatetags): |sig shows 4 significant digits with the
exact value on hover and escapes text; |breakable lets a name wrap after _ . - / only."""

from __future__ import annotations

from django.template import Context, Template


def render(source: str, **values) -> str:
    return Template("{% load studio_tags %}" + source).render(Context(values))


def test_sig_rounds_long_floats_and_keeps_the_exact_value_in_the_title():
    assert render("{{ v|sig }}", v=0.00031622776601683794) == (
        '<span class="num-exact" title="0.00031622776601683794" data-exact="0.00031622776601683794">0.0003162</span>')
    assert render("{{ v|sig }}", v=0.1) == "0.1"  # short already: no hover
    assert render("{{ v|sig }}", v=1e-05) == "1e-05"
    assert render("{{ v|sig }}", v=123456.789).endswith(">1.235e+05</span>")
    assert render("{{ v|sig }}", v=3) == "3"
    assert render("{{ v|sig }}", v=True) == "true"
    assert render("{{ v|sig }}", v=None) == "—"
    assert render("{{ v|sig }}", v={"b": 1, "a": [1, 2]}) == "{&quot;a&quot;: [1, 2], &quot;b&quot;: 1}"
    assert render("{{ v|sig }}", v="<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;"
    assert render("{{ v|sig }}", v=float("nan")) == "nan"


def test_breakable_puts_break_chances_after_separators_and_escapes():
    assert render("{{ v|breakable }}", v="gradient_accumulation_steps") == "gradient_<wbr>accumulation_<wbr>steps"
    assert render("{{ v|breakable }}", v="<x>_y") == "&lt;x&gt;_<wbr>y"
    assert render("{{ v|breakable }}", v="plain") == "plain"
