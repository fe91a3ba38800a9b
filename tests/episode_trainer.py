"""trainer.py whose episodes stop on a token a random tiny model emits often (a test fixture, not product code).

    CALL_END_ID=<token id> python tests/episode_trainer.py [--nproc_per_node N] --config ... [--key=value ...]

A random model never writes `</tool_call>`; with the call-end token replaced by a frequent one, its rollouts become
multi-turn episodes (every segment ending on that token is a tool call, answered by the row's environment: for the
calculator, a malformed-call error) and the whole RL loop runs with tools: scheduling, buffering, masks, resume.
"""
import os
import sys

import launch
import trainer
from rollout import environments

_init = environments.Observations.__init__


def observations(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.call_end = int(os.environ["CALL_END_ID"])


environments.Observations.__init__ = observations

if __name__ == "__main__":
    launch.exit_process(trainer.main(sys.argv[1:]))
