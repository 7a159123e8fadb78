"""Command-line flags from a settings dataclass: one flag per field, so a setting is named, typed and
documented once (on its field) and reads the same in a TOML file, a flag and an environment variable.

    @dataclass
    class Settings:
        port: int = setting(8080, "port to bind")
        upstreams: list[str] = setting(None, "a vLLM server; repeat for replicas", flag="--upstream", repeat=True)

Each flag's default is, in order: the environment variable (`env_prefix` + FIELD, or the field's
own `env`), the field's default (or None with `keep_defaults=False`, so a caller can tell "not
given" from "given"). A field without a default and without its variable is a required flag.
Standard library only: every part's `--help` works without its extras.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from typing import Any

_MISSING = dataclasses.MISSING


def setting(
    default: Any = _MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    env: str | None = None,
    repeat: bool = False,
    default_factory: Any = _MISSING,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field with its flag's help (and, when the flag or variable is not the usual one, its
    names; `aliases` are further flags for the same field)."""
    metadata = {"help": help, "flag": flag, "env": env, "repeat": repeat, "aliases": aliases}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def value_type(settings_type: type, name: str) -> Any:
    """int, float, str, bool or list for a field (Optional[X] is X)."""
    hint = typing.get_type_hints(settings_type)[name]
    if typing.get_origin(hint) is list:
        return list
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def parse_value(kind: Any, text: Any) -> Any:
    """A flag's or environment variable's text as the field's type (lists comma-separated)."""
    if not isinstance(text, str):
        return text
    if kind is bool:
        return parse_bool(text)
    if kind is list:
        return [item for item in text.split(",") if item]
    return kind(text) if kind in (int, float) else text


def _default(field: dataclasses.Field) -> Any:
    if field.default is not _MISSING:
        return field.default
    if field.default_factory is not _MISSING:
        return field.default_factory()
    return _MISSING


def add_flags(
    parser: argparse.ArgumentParser,
    settings_type: type,
    *,
    env_prefix: str | None = "LIGHTNING_OTEL_",
    section: str | None = None,
    keep_defaults: bool = True,
) -> None:
    """One flag per field of `settings_type`; with `section`, flags are --<section>-<field> and land
    in args as "<section>.<field>"."""
    for field in dataclasses.fields(settings_type):
        meta = field.metadata
        kind = value_type(settings_type, field.name)
        name = f"{section}_{field.name}" if section else field.name
        flag = meta.get("flag") or "--" + name.replace("_", "-")
        env = meta.get("env") or (env_prefix + field.name.upper() if env_prefix else None)
        default = _default(field)
        shown = "" if default in (_MISSING, None, "", []) else f" (default {default})"
        if env and env in os.environ:
            default = parse_value(kind, os.environ[env])
        elif not keep_defaults and default is not _MISSING:
            default = None
        help_text = f"{meta.get('help', '')}{shown}" + (f" [${env}]" if env else "")
        options: dict[str, Any] = {"dest": f"{section}.{field.name}" if section else field.name, "help": help_text}
        if kind is not bool:
            options["metavar"] = field.name.upper()
        if default is _MISSING:
            options["required"] = True
        else:
            options["default"] = default
        if kind is bool:
            options.update(nargs="?", const=True, type=parse_bool, metavar="BOOL")
        elif kind is list and meta.get("repeat"):
            options.update(action="append", default=None if default is _MISSING else default)
        else:
            options["type"] = (lambda text, kind=kind: parse_value(kind, text)) if kind is list else kind
        parser.add_argument(flag, *meta.get("aliases", ()), **options)


def from_args(settings_type: type, args: argparse.Namespace) -> Any:
    """The settings the flags of add_flags() (without a section) were given."""
    return settings_type(**{f.name: getattr(args, f.name) for f in dataclasses.fields(settings_type)})
