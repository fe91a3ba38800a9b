"""The AutoTriton reward (README.md here): `from rewards.triton.kernel import triton_reward`."""
