"""leanrl: single-file RL training scripts, each an eager baseline and a fast twin; run one as
`python leanrl/<script>.py` or `python -m leanrl.<script>`."""
