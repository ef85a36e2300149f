"""Model resolution: turn ``--model`` / ``LLM(model=...)`` into a local checkpoint directory.

Three kinds of names, checked in this order:

1. ``deepinfer/tiny...``: an embedded checkpoint.  A package (e.g. the model package's
   testing module) registers a builder with ``register_embedded_model``; the first
   resolve builds it into ``$DEEPINFER_CACHE/<name with / as -->`` (default
   ``~/.cache/deepinfer``) and later resolves reuse it.  The build writes into a
   temporary sibling directory that is renamed into place, so a crashed or concurrent
   build never leaves a half-written checkpoint under the final name.
2. A local directory: returned as is; it must hold ``config.json``.  A name starting
   with ``/``, ``.`` or ``~`` is always treated as local.
3. Anything else is a Hugging Face hub repo id, fetched with
   ``huggingface_hub.snapshot_download`` into the standard HF cache (only the json,
   safetensors and tokenizer files).  With ``HF_HUB_OFFLINE=1`` only the cache is
   consulted.  Any failure becomes ``ModelNotFoundError`` with a one-sentence message
   that says how to pass a local directory instead.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_MODEL = "deepseek-ai/DeepSeek-V4.1-Flash-1017"
EMBEDDED_PREFIX = "deepinfer/tiny"
# What a checkpoint needs: config/tokenizer json, weights, tokenizer extras.
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*"]
CONFIG_FILE = "config.json"

_TRUE_STRINGS = {"1", "on", "yes", "true"}
_EMBEDDED_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


class ModelNotFoundError(ValueError):
    """The model name resolves to nothing usable; the message says what to pass instead."""


# -- embedded checkpoints ----------------------------------------------------------
@dataclass(frozen=True)
class _EmbeddedModel:
    builder: Callable[[Path], None]
    version: str | None


_EMBEDDED: dict[str, _EmbeddedModel] = {}
_BUILD_LOCK = threading.Lock()


def register_embedded_model(name: str, builder: Callable[[Path], None], *, version: str | None = None) -> None:
    """Register ``builder(dir)``, which writes a complete checkpoint (config.json,
    tokenizer, safetensors) into the existing empty directory ``dir``.

    ``name`` must start with ``"deepinfer/tiny"``.  ``version`` is part of the cache
    directory name: bump it when the builder's output changes so stale caches are not
    reused.  Registering a name again replaces the earlier builder.
    """
    if not isinstance(name, str) or not name.startswith(EMBEDDED_PREFIX):
        raise ValueError(f"embedded model names must start with {EMBEDDED_PREFIX!r}, got {name!r}")
    if not _EMBEDDED_NAME_RE.match(name):
        raise ValueError(f"embedded model name {name!r} may only use letters, digits, '.', '_', '-' and '/'")
    if not callable(builder):
        raise TypeError(f"builder for {name!r} must be callable, got {type(builder).__name__}")
    if version is not None and (not isinstance(version, str) or not _EMBEDDED_NAME_RE.match(version) or "/" in version):
        raise ValueError(f"version for {name!r} must be a short token like '2', got {version!r}")
    _EMBEDDED[name] = _EmbeddedModel(builder, version)


def embedded_model_names() -> list[str]:
    """Names registered with ``register_embedded_model``, sorted."""
    return sorted(_EMBEDDED)


def embedded_cache_root() -> Path:
    """``$DEEPINFER_CACHE`` if set, else ``~/.cache/deepinfer``."""
    env = os.environ.get("DEEPINFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "deepinfer"


def _resolve_embedded(name: str) -> Path:
    entry = _EMBEDDED.get(name)
    if entry is None:
        known = ", ".join(embedded_model_names()) or "none"
        raise ModelNotFoundError(
            f"no embedded model is registered under {name!r} (registered: {known}); import the package "
            f"that registers it (e.g. deepinfer_models.testing) or pass a local directory with --model /path."
        )
    root = embedded_cache_root()
    dirname = name.replace("/", "--") + (f"@{entry.version}" if entry.version else "")
    final = root / dirname
    if (final / CONFIG_FILE).is_file():
        return final
    with _BUILD_LOCK:  # one build per process; other processes are handled by rename
        if (final / CONFIG_FILE).is_file():
            return final
        if final.exists():
            raise ModelNotFoundError(
                f"the embedded model cache {final} exists but holds no {CONFIG_FILE}; delete that directory "
                f"so it can be rebuilt."
            )
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dirname}.tmp-", dir=root))
        try:
            entry.builder(tmp)
            if not (tmp / CONFIG_FILE).is_file():
                raise RuntimeError(f"the builder registered for {name!r} did not write {CONFIG_FILE} into {tmp}")
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; caches are shared like HF's
            try:
                os.rename(tmp, final)
            except OSError:
                # Another process finished first: keep its copy, drop ours.
                if not (final / CONFIG_FILE).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


# -- local directories and the hub ---------------------------------------------------
def _looks_local(model: str) -> bool:
    return model.startswith(("/", ".", "~"))


def _hub_offline() -> bool:
    # Read at call time: huggingface_hub reads HF_HUB_OFFLINE only once, at import.
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE_STRINGS:
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _check_local_dir(path: Path, model: str) -> Path:
    if not path.is_dir():
        raise ModelNotFoundError(f"the model path {model!r} is a file, not a checkpoint directory.")
    if not (path / CONFIG_FILE).is_file():
        raise ModelNotFoundError(
            f"the model directory {str(path)!r} has no {CONFIG_FILE}, so it is not a checkpoint directory "
            f"(expected config.json, tokenizer.json and *.safetensors)."
        )
    return path


def _fetch_failure_reason(exc: BaseException, offline: bool) -> str:
    from huggingface_hub import errors

    if isinstance(exc, errors.HFValidationError):
        return "it is neither an existing local directory nor a valid hub repo id"
    if offline:
        return "offline mode is on (HF_HUB_OFFLINE=1) and no copy is in the Hugging Face cache"
    if isinstance(exc, errors.GatedRepoError):
        return "the repository is gated and needs an accepted licence and a token"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return "the repository does not exist on the hub or is private"
    if isinstance(exc, errors.RevisionNotFoundError):
        return "the requested revision does not exist"
    if isinstance(exc, errors.LocalEntryNotFoundError):
        return "the hub could not be reached and no copy is in the Hugging Face cache"
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return f"of {type(exc).__name__}{': ' + detail if detail else ''}".rstrip(".")


def _not_fetched(model: str, reason: str) -> ModelNotFoundError:
    leaf = model.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(r"[A-Za-z0-9._-]+", leaf):
        leaf = "model"
    return ModelNotFoundError(
        f"The weights for {model!r} could not be fetched from the Hugging Face Hub because {reason}; "
        f'pass a local checkpoint directory instead, e.g. LLM(model="/path/to/{leaf}") or --model /path/to/{leaf}.'
    )


def resolve_model_path(model: str, revision: str | None = None, *, cache_dir: str | Path | None = None) -> Path:
    """Local checkpoint directory for ``model`` (see module docstring for the rules).

    Args:
        model: ``deepinfer/tiny...`` name, local directory, or hub repo id.
        revision: hub branch/tag/commit; ignored for local and embedded models.
        cache_dir: HF cache to use instead of the default (``HF_HUB_CACHE``).
    Raises:
        ModelNotFoundError: nothing usable under that name.
    """
    if not isinstance(model, str) or not model.strip():
        raise ModelNotFoundError(f"model must be a non-empty string (a local directory or hub id), got {model!r}.")
    if model.startswith(EMBEDDED_PREFIX):
        return _resolve_embedded(model)

    local = Path(model).expanduser()
    if local.exists():
        return _check_local_dir(local, model)
    if _looks_local(model):
        raise ModelNotFoundError(f"the model directory {str(local)!r} does not exist.")

    import huggingface_hub

    offline = _hub_offline()
    try:
        snapshot = huggingface_hub.snapshot_download(
            repo_id=model,
            revision=revision,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            allow_patterns=HUB_ALLOW_PATTERNS,
            local_files_only=offline,
        )
    except Exception as e:  # network stacks and hub versions raise many types
        raise _not_fetched(model, _fetch_failure_reason(e, offline)) from e
    path = Path(snapshot)
    if not (path / CONFIG_FILE).is_file():
        raise ModelNotFoundError(
            f"the hub repository {model!r} was fetched to {str(path)!r} but has no {CONFIG_FILE}, "
            f"so it is not a model checkpoint."
        )
    return path
