"""The models one `deepseek-tfx serve` process serves, and which of them answers a request.

  --model DIR [--model-name NAME]      one model, as ever (NAME default "deepseek")
  --model A=DIR_A --model B=DIR_B      several, each under its name
  --split A=90,B=10                    the split route's traffic in these shares

Every model is reachable by its own name: TF Serving's `/v1/models/<name>...` and the
OpenAI API's `"model": "<name>"`. The split takes the traffic of one route name, the
*split name*: `--model-name` (default "deepseek") when it is not itself a served model.
`/v1/models/deepseek:predict`, and an OpenAI request whose `model` is "deepseek" or
missing, then go to A or B in the given shares (`serving/model_split.py`): sticky for a
request that carries a user or session id (OpenAI's `user` field, or the
`X-Session-Id` header on any route), random otherwise. Without `--split`, the split
name and a missing OpenAI `model` mean the first model given.
"""

from __future__ import annotations

from serving.model_split import ModelSplit
from serving.server import ModelServer


class ServedModels:
    """A registry of loaded `ModelServer`s, with an optional A/B split.

    Implements the OpenAI router's `ModelRegistry` protocol (`names`, `get`).

    Args:
      servers: {name: ModelServer}, in the order given on the command line (the
        first is the default).
      split: how the split name's traffic is shared, or None.
      split_name: the route name the split answers ("deepseek"); ignored without
        `split`. Must not be a served model's name when `split` is given.

    Raises:
      ValueError: no servers, a server whose `.name` differs from its key, or a
        split name that is also a served model.
    """

    def __init__(self, servers: dict[str, ModelServer], split: ModelSplit | None = None,
                 split_name: str | None = None):
        if not servers:
            raise ValueError("serve needs at least one model")
        for name, server in servers.items():
            if server.name != name:
                raise ValueError(f"model '{name}' is loaded as '{server.name}'")
        if split is not None and split_name in servers:
            raise ValueError(f"the split name '{split_name}' is also a served model: give "
                             "--model-name another name for the split's route")
        self.servers = dict(servers)
        self.split = split
        self.split_name = split_name if split is not None else None
        self.default = next(iter(self.servers))

    def names(self) -> list[str]:
        """The served models' names (the split name is not one)."""
        return list(self.servers)

    def get(self, name: str | None, user: str | None = None) -> ModelServer:
        """The server that answers a request for `name` from `user`.

        Args:
          name: a served model's name; the split name (the split chooses); None (the
            split chooses when there is one, else the first model).
          user: a user or session id that makes the split's choice sticky, or None.

        Raises:
          KeyError: `name` is neither a served model nor the split name.
        """
        if name is not None and name in self.servers:
            return self.servers[name]
        if name is None or name == self.split_name:
            if self.split is not None:
                return self.servers[self.split.choose(user or None)]
            if name is None:
                return self.servers[self.default]
        raise KeyError(name)

    def members(self, name: str) -> list[ModelServer]:
        """The servers a route name stands for: one model, or the split's models.

        Raises:
          KeyError: as `get`.
        """
        if name in self.servers:
            return [self.servers[name]]
        if self.split is not None and name == self.split_name:
            return [self.servers[n] for n in self.split.names]
        raise KeyError(name)

    def close(self) -> None:
        """Stops every server's batch threads."""
        for server in self.servers.values():
            server.close()
