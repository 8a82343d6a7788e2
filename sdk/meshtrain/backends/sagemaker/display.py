"""What a SageMaker job's `wait()` adds to meshtrain.display: status transitions as the SageMaker
SDK prints them, and the status line's text."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def _utc_text(value: Any) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def secondary_status_lines(current: dict[str, Any], previous: dict[str, Any] | None) -> list[str]:
    """New secondary-status transitions, ``"<YYYY-mm-dd HH:MM:SS> <Status> - <StatusMessage>"``.

    As SDK ``utils.secondary_training_status_changed`` / ``secondary_training_status_message``:
    nothing if the last message did not change; otherwise the transitions added since
    `previous` (or the last one again when only its message changed), stamped with the job's
    LastModifiedTime in UTC.
    """
    transitions = current.get("SecondaryStatusTransitions") or []
    if not transitions:
        return []
    before = (previous or {}).get("SecondaryStatusTransitions") or []
    last_message = before[-1].get("StatusMessage", "") if before else ""
    if previous is not None and transitions[-1].get("StatusMessage", "") == last_message:
        return []
    shown = transitions[-1:] if len(transitions) == len(before) else transitions[len(before):]
    stamp = _utc_text(current.get("LastModifiedTime") or shown[-1].get("StartTime"))
    return [f"{stamp} {t['Status']} - {t.get('StatusMessage', '')}" for t in shown]


def status_summary(description: dict[str, Any]) -> str:
    """The live display's status: status, secondary status and its message."""
    transitions = description.get("SecondaryStatusTransitions") or [{}]
    message = transitions[-1].get("StatusMessage", "")
    summary = f"{description['TrainingJobStatus']} / {description.get('SecondaryStatus', '')}"
    return f"{summary} - {message}" if message else summary
