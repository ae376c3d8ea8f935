"""The environment registry: ``register(name, entry_point, **defaults)`` and ``make(name, **kwargs)``.

Like Gymnasium's: an environment is registered under a name with an entry point (``"module:Class"`` or a
callable returning an ``Env``) and default keyword arguments; ``make`` builds one. Environments of other
packages are discovered through the Python entry-point group ``trajlake.envs``: an entry point named NAME
that loads an ``Env`` subclass (or a factory) registers it as NAME; one that loads a plain function is called
once and registers what it likes (an ``EnvSpec`` is registered as it is). Rollout, replay, eval, browse and the Gymnasium ids all resolve environments
here; nothing in trajlake switches on environment names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trajlake.envs.core import Env

from trajlake.errors import TrajlakeError, UnknownEnvironmentError

ENTRY_POINT_GROUP = "trajlake.envs"


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment."""

    name: str
    """The id used by ``make``, ``trajlake rollout --env`` and ``episodes.env_id``."""
    entry_point: str | Callable[..., Env]
    """``"package.module:Attr"`` (imported on first use) or a callable returning an ``Env``."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments ``make`` passes unless the caller overrides them."""
    gym_id: str | None = None
    """Gymnasium id registered for it (e.g. ``trajlake/MiniSWE-v0``), when gymnasium is installed."""
    gym_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the Gymnasium id (e.g. its split)."""

    def load(self) -> Callable[..., Env]:
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        if not module or not attr:
            raise TrajlakeError(f"environment {self.name!r}: entry point {self.entry_point!r} is not 'module:attr'")
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise TrajlakeError(f"environment {self.name!r}: cannot load {self.entry_point!r}: {e}") from e
        if not callable(obj):
            raise TrajlakeError(f"environment {self.name!r}: {self.entry_point!r} is not callable")
        return obj

    def env_class(self) -> type[Env] | None:
        """The Env subclass behind the entry point, when it is a class (for class-level facts like policies)."""
        target = self.load()
        return target if isinstance(target, type) and issubclass(target, Env) else None


_REGISTRY: dict[str, EnvSpec] = {}
_LOCK = threading.Lock()
_DISCOVERED = False


def register(name: str, entry_point: str | Callable[..., Env], *, gym_id: str | None = None,
             gym_kwargs: Mapping[str, Any] | None = None, override: bool = False, **defaults: Any) -> EnvSpec:
    """Register an environment under ``name``. Registering the same name again with the same entry point is a
    no-op; with another entry point it is an error unless ``override``."""
    if not name or not isinstance(name, str):
        raise TrajlakeError("an environment needs a non-empty name")
    spec = EnvSpec(name, entry_point, dict(defaults), gym_id, dict(gym_kwargs or {}))
    with _LOCK:
        old = _REGISTRY.get(name)
        if old is not None and not override and old.entry_point != entry_point:
            raise TrajlakeError(f"environment {name!r} is already registered ({old.entry_point!r})")
        _REGISTRY[name] = spec
    if gym_id:
        _register_gymnasium(spec)
    return spec


def spec(name: str) -> EnvSpec:
    """The spec registered under ``name`` (discovering third-party entry points when it is not known yet)."""
    found = _REGISTRY.get(name)
    if found is None:  # installed since the last look (plugins may come and go on sys.path)
        discover(force=True)
        found = _REGISTRY.get(name)
    if found is None:
        raise UnknownEnvironmentError(f"unknown environment {name!r}; environments: {', '.join(names()) or 'none'}")
    return found


def make(name: str, **kwargs: Any) -> Env:
    """Build the environment registered as ``name`` with its defaults updated by ``kwargs``."""
    s = spec(name)
    env = s.load()(**{**s.defaults, **kwargs})
    if not isinstance(env, Env):
        raise TrajlakeError(f"environment {name!r}: {s.entry_point!r} returned {type(env).__name__}, not an Env")
    return env


def names() -> list[str]:
    """Every registered environment name (after discovery), sorted."""
    discover()
    return sorted(_REGISTRY)


def unregister(name: str) -> None:
    """Forget ``name`` (tests and plugins that replace an environment)."""
    with _LOCK:
        _REGISTRY.pop(name, None)


def discover(*, force: bool = False) -> None:
    """Register the environments of installed packages (entry-point group ``trajlake.envs``); names already
    registered are kept. ``force`` looks again after a first discovery."""
    global _DISCOVERED
    if _DISCOVERED and not force:
        return
    _DISCOVERED = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not hide the others; it fails when it is asked for
            _broken(ep.name, ep.value, e)
            continue
        if isinstance(obj, type) and issubclass(obj, Env):
            register(ep.name, obj, override=True)
        elif isinstance(obj, EnvSpec):
            register(obj.name, obj.entry_point, gym_id=obj.gym_id, gym_kwargs=obj.gym_kwargs, override=True,
                     **obj.defaults)
        elif callable(obj):  # a hook that registers one or more environments itself
            obj()


def _broken(name: str, value: str, err: Exception) -> None:
    def fail(**_: Any) -> Env:
        raise TrajlakeError(f"environment {name!r} (entry point {value!r}) failed to load: {err}")

    with _LOCK:
        _REGISTRY.setdefault(name, EnvSpec(name, fail))


def _register_gymnasium(s: EnvSpec) -> None:
    try:
        import gymnasium
    except ImportError:
        return
    if s.gym_id and s.gym_id not in gymnasium.registry:
        gymnasium.register(id=s.gym_id, entry_point="trajlake.envs.gym:TrajlakeGymEnv", kwargs={"name": s.name, **s.gym_kwargs})


__all__ = ["ENTRY_POINT_GROUP", "EnvSpec", "UnknownEnvironmentError", "discover", "make", "names", "register",
           "spec", "unregister"]
