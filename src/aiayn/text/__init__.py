"""Real text around the model (not in the paper): documents split into sentences and joined
back (``document``), with the segmenter of ``segment``; markup and placeholders taken out and
put back (``markup``). Torch-free: it works on strings and on what a tokenizer returns."""
