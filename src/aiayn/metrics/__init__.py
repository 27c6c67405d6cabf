"""Evaluation metrics; no torch imports here (metrics run on text)."""

from .bleu import atat_split, moses_tokenize, multi_bleu, paper_bleu, sacre_bleu

__all__ = ["atat_split", "moses_tokenize", "multi_bleu", "paper_bleu", "sacre_bleu"]
