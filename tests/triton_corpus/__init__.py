"""Candidates for the Triton reward's tests (issue 29): `honest` (kernels written the ways people and models write
Triton, each must score 1.0) and `attacks` (the fourth-round adversarial corpus, each must score 0 with its reason).
"""
