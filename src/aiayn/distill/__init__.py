"""``aiayn distill``: a small, fast student translator trained on what a teacher translates
(sequence-level knowledge distillation); the steps are ``pipeline``'s docstring, and
docs/distill.md says what each costs."""

from .pipeline import Budget, Teaching, run_distill

__all__ = ["Budget", "Teaching", "run_distill"]
