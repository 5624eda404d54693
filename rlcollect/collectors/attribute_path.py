"""`resolve_attribute_path`: an object reached from another by a path of attributes and
subscripts, e.g. `"_receiver_schemes['policy'].receive"` or `"env.transform[0]"` (what
TorchRL's `cascade_execute` and `get_model(model_id)` take)."""

from __future__ import annotations

import re
from typing import Any

# One step: `.name`, `name` at the start, `[3]`, `['key']` or `["key"]`.
_STEP = re.compile(
    r"""(?:^|\.)(?P<attribute>[A-Za-z_]\w*)"""
    r"""|\[(?P<index>-?\d+)\]"""
    r"""|\[(?P<quote>['"])(?P<key>[^'"]*)(?P=quote)\]"""
)


def _steps(path: str) -> list[tuple[str, Any]]:
    """The steps of `path` as `("attribute", name)` or `("item", key)`.

    Raises:
        ValueError: `path` is empty or holds anything but attributes and subscripts.
    """
    steps: list[tuple[str, Any]] = []
    position = 0
    while position < len(path):
        match = _STEP.match(path, position)
        if match is None or (match["attribute"] and position == 0 and path[0] == "."):
            raise ValueError(
                f"attribute path {path!r} cannot be read at position {position}; write it as "
                "attributes and subscripts, e.g. \"_receiver_schemes['policy'].receive\"."
            )
        if match["attribute"] is not None:
            steps.append(("attribute", match["attribute"]))
        elif match["index"] is not None:
            steps.append(("item", int(match["index"])))
        else:
            steps.append(("item", match["key"]))
        position = match.end()
    if not steps:
        raise ValueError("attribute path is empty; name an attribute, e.g. 'env'.")
    return steps


def resolve_attribute_path(root: Any, path: str) -> Any:
    """What `path` names, starting from `root`.

    Raises:
        ValueError: a malformed path.
        AttributeError / KeyError / IndexError: a step that does not exist (naming the path).
    """
    value = root
    for kind, step in _steps(path):
        try:
            value = getattr(value, step) if kind == "attribute" else value[step]
        except (AttributeError, KeyError, IndexError) as err:
            raise type(err)(f"{path!r}: {step!r} does not exist on {type(value).__name__}") from err
    return value


def resolve_model(root: Any, model_id: str, owner: str | None = None) -> Any:
    """The module a model id other than `"policy"` names on `root` (a collector), e.g.
    `"env.transform[0].module"`, as TorchRL resolves the ids of `weights_dict`; `owner`
    names the collector in errors (default: `root`'s type).

    Raises:
        KeyError: the path leads nowhere (naming the model id and the missing step).
        ValueError: a malformed path.
        TypeError: it names something that is not an `nn.Module` (no weights to load).
    """
    from torch import nn

    try:
        model = resolve_attribute_path(root, model_id)
    except (AttributeError, KeyError, IndexError) as err:
        raise KeyError(
            f"model id {model_id!r} names no model of the {owner or type(root).__name__}: "
            f"{err.args[0]}. "
            "A model id is 'policy' or an attribute path on the collector that runs the env, "
            "e.g. 'env.transform[0].module'."
        ) from err
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model id {model_id!r} names a {type(model).__name__}, not an nn.Module; name the "
            "module whose weights to load, e.g. 'env.transform[0].module'."
        )
    return model
