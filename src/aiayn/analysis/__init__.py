"""Reports on models and runs, built on the library: pictures (training curves, attention maps
as Figures 3-5), diagnostics (does the model read its source?) and the preset table."""
