"""An example reward file for `reward.funcs` (docs/data.md; tests/test_user_rewards.py trains the demo task with it):

    reward:
      funcs: [rewards/example_reward_funcs.py:boxed_answer, rewards/example_reward_funcs.py:digit_share]
      weights: [1.0, 0.5]

Each function gets the data row and the model's completion (and, if it takes a third argument, the episode's chat
messages: None for a single-turn row) and returns a float, (float, info dict) or None (does not apply). TRL's and
verl's shapes work too (rewards/styles.py). It may raise: that function is then left out of the sample's sum, the
sample's reason is reward_error, the step prints a line naming the file and line, and the run goes on.
"""
import re


def boxed_answer(row: dict, completion: str) -> tuple[float, dict]:
    """1 if the last \\boxed{...} of the completion holds the row's answer (as text), else 0."""
    found = re.findall(r"\\boxed\{([^{}]*)\}", completion)
    if not found:
        return 0.0, {"reason": "no_box"}
    return float(found[-1].strip() == str(row["answer"]).strip()), {"reason": "ok"}


def digit_share(row: dict, completion: str, messages=None) -> float:
    """The share of the completion's non-space characters that are digits: a dense shaping term even a random model
    earns (messages: the episode where tools are on, unused here)."""
    text = "".join(completion.split())
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0
