"""The worker side of the "process" backend: an `EpisodeRunner` served over a command pipe.

The process, its pipes, liveness and error replies (with the worker's traceback) are
`rlcollect.runtime.processes`'s, as for `ParallelEnv` and the multi-process collectors. The
worker runs `init_fn`, builds the env and the policy, reports the policy's weights layout
(so the parent checks weights before it sends them), then answers one command at a time: a
whole evaluation, the policy's state, or the weight channel of a scheme that has one.
"""

from __future__ import annotations

import enum
import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rlcollect.collectors.evaluation.runner import EpisodeRunner
from rlcollect.collectors.evaluation.spec import EvaluationWorkerSpec
from rlcollect.collectors.policy.weights import state_layout
from rlcollect.collectors.weights.schemes import POLICY_MODEL_ID, WeightSyncScheme
from rlcollect.runtime.payload import WorkerPayload
from rlcollect.runtime.processes import HEADER, OK, command_describer, error_reply, serve_commands


class EvaluationCommand(enum.IntEnum):
    """What the parent asks the evaluation worker; the header's argument is the step."""

    EVALUATE = 1  # payload: pickled (scheme payload or None, other models' weights)
    POLICY_STATE = 2
    CHANNEL = 3  # payload: the scheme's channel, pickled by multiprocessing's pickler
    CLOSE = 4


describe_command = command_describer(
    EvaluationCommand, {EvaluationCommand.EVALUATE: "an evaluation (step {argument})"}
)


def run_evaluation_worker(index: int, connection: Connection, payload: WorkerPayload) -> None:
    """Serve one runner (the target `bootstrap` runs): build it, report its weights layout,
    answer commands until `CLOSE` or until the parent's pipe closes, then close it."""
    try:
        spec: EvaluationWorkerSpec = payload.load()
        runner = spec.build()
        layout = state_layout(runner.policy_state())
    except BaseException as err:  # sys.exit() in a factory is reported like any error
        connection.send_bytes(error_reply(err, "building the evaluation env and policy"))
        return
    connection.send_bytes(OK + pickle.dumps(layout))
    try:
        EvaluationServer(runner, spec.scheme).serve(connection)
    finally:
        runner.close()


class EvaluationServer:
    """Answers a parent's commands with one runner."""

    def __init__(self, runner: EpisodeRunner, scheme: WeightSyncScheme) -> None:
        self.runner = runner
        self.scheme = scheme
        self.channel: Any = None
        self.handlers: dict[int, Callable[[int, bytes], bytes]] = {
            EvaluationCommand.EVALUATE: self.evaluate,
            EvaluationCommand.POLICY_STATE: lambda *_: pickle.dumps(runner.policy_state()),
            EvaluationCommand.CHANNEL: self.attach_channel,
        }

    def serve(self, connection: Connection) -> None:
        serve_commands(connection, self.handle, EvaluationCommand.CLOSE, describe_command)

    def handle(self, command: int, argument: int, message: bytes) -> bytes:
        return self.handlers[command](argument, message[HEADER.size :])

    def evaluate(self, step: int, payload: bytes) -> bytes:
        """Load the weights the message carries, if any, and run one evaluation."""
        scheme_payload, models = pickle.loads(payload)
        weights = dict(models)
        if scheme_payload is not None:
            policy_weights = self.scheme.unpack(self.channel, scheme_payload)
            if policy_weights is not None:
                weights[POLICY_MODEL_ID] = policy_weights
        return pickle.dumps(self.runner.run(weights or None, step))

    def attach_channel(self, _: int, payload: bytes) -> bytes:
        self.channel = pickle.loads(payload)
        return b""
