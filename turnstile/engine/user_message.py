"""The user message as it moves through steps 3 to 10, and the checks of
step 6. Pure code: the workflow builds it; only the stored form reaches memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from turnstile.engine import attributes as attr
from turnstile.engine.activity_io import AttachmentMeta, Snippet
from turnstile.engine.errors import AttachmentError
from turnstile.engine.messages import Attachment, ChatMessage
from turnstile.engine.pipeline_spec import PipelinePolicy
from turnstile.engine.turn_rules import render_template

_BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]*$")
_IMAGE_URL = re.compile(r"^(https?://|data:image/)", re.IGNORECASE)


@dataclass(frozen=True)
class UserMessage:
    raw: str  # the turn input's message, as the user sent it
    text: str  # what the model reads: templated, augmented, format instructions
    unaugmented: str  # the same without the retrieved text
    sources: list[dict[str, str]] = field(default_factory=list)  # retrieved documents
    parts: list[Attachment] = field(default_factory=list)

    def augmented(self, snippets: list[Snippet], template: str) -> UserMessage:
        """Step 5: the retrieved text goes into the user message only."""
        contents = "\n\n".join(f"[{s.title}]\n{s.text}" for s in snippets)
        text = render_template(template, {"message": self.text, "contents": contents})
        return replace(self, text=text,
                       sources=[{"doc_id": s.doc_id, "title": s.title} for s in snippets])

    def appended(self, suffix: str) -> UserMessage:
        return replace(self, text=self.text + suffix, unaugmented=self.unaugmented + suffix)

    def stored(self, policy: PipelinePolicy) -> ChatMessage:
        """Step 10: what memory keeps (docs/pipeline.md, retrieval memory)."""
        attributes: dict[str, Any] = {}
        content = self.text
        if self.sources:
            attributes[attr.RAW_USER_MESSAGE] = self.raw
            attributes[attr.RETRIEVED_SOURCES] = self.sources
            if policy.retrieval_memory == "original":
                # This turn's model calls still read the augmented text (the
                # store swaps it in for the turn that wrote it); later turns don't.
                attributes[attr.AUGMENTED_USER_MESSAGE] = self.text
                content = self.unaugmented
        return ChatMessage(role="user", content=content, attributes=attributes,
                           parts=list(self.parts))

    def attachment_meta(self) -> list[AttachmentMeta]:
        return [AttachmentMeta(type=p.type, mime_type=p.mime_type,
                               url=None if (p.url or "").startswith("data:") else p.url,
                               chars=p.inline_chars()) for p in self.parts]


def checked_attachments(parts: list[Attachment], policy: PipelinePolicy) -> list[Attachment]:
    """Step 6: refuse what the model could not take or history should not carry."""
    if len(parts) > policy.max_attachments:
        raise AttachmentError(f"{len(parts)} attachments; at most {policy.max_attachments} "
                              "per message")
    for i, p in enumerate(parts):
        where = f"attachment {i} ({p.type})"
        if p.type == "image_url":
            if not p.url or not _IMAGE_URL.match(p.url):
                raise AttachmentError(f"{where}: needs `url`, an http(s) URL or a data:image/ "
                                      "URL")
        elif p.type == "image_base64":
            if not p.data or not (p.mime_type or "").startswith("image/"):
                raise AttachmentError(f"{where}: needs `data` (base64) and an image/* "
                                      "`mime_type`")
            if not _BASE64.match(p.data):
                raise AttachmentError(f"{where}: `data` is not base64")
        else:
            raise AttachmentError(f"{where}: unknown type; use image_url or image_base64")
    inline = sum(p.inline_chars() for p in parts)
    if inline > policy.max_inline_attachment_chars:
        raise AttachmentError(
            f"attachments carry {inline} characters of inline data; the limit is "
            f"{policy.max_inline_attachment_chars} (it travels in the workflow history): "
            "pass large images as https URLs")
    return list(parts)
