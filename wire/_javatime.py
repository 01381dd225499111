"""java.time text forms: the wire stores dates and times as Java's `toString()` output."""

from __future__ import annotations

import datetime as _dt
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_FRACTION = re.compile(r"\.(\d+)")


def format_time(t: _dt.time) -> str:
    """LocalTime.toString(): seconds only when non-zero, fraction in groups of 3 digits."""
    text = f"{t.hour:02d}:{t.minute:02d}"
    if t.second or t.microsecond:
        text += f":{t.second:02d}"
        if t.microsecond:
            text += f".{t.microsecond // 1000:03d}" if t.microsecond % 1000 == 0 else f".{t.microsecond:06d}"
    return text


def format_date(d: _dt.date) -> str:
    """LocalDate.toString(): years beyond 9999 carry a '+' (Python cannot hold them anyway)."""
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}"


def format_datetime(v: _dt.datetime) -> str:
    """LocalDateTime / ZonedDateTime.toString(); an IANA zone is appended as `[zone]` like Java."""
    text = f"{format_date(v.date())}T{format_time(v.time())}"
    if v.tzinfo is None:
        return text
    offset = v.utcoffset()
    assert offset is not None
    seconds = int(offset.total_seconds())
    if seconds == 0:
        text += "Z"
    else:
        sign = "+" if seconds > 0 else "-"
        seconds = abs(seconds)
        text += f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}"
        if seconds % 60:
            text += f":{seconds % 60:02d}"
    if isinstance(v.tzinfo, ZoneInfo):
        text += f"[{v.tzinfo.key}]"
    return text


def _micros(text: str) -> str:
    """Python keeps microseconds; Java may write nanoseconds (truncated, not rounded)."""
    return _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)


def parse_time(text: str) -> _dt.time:
    return _dt.time.fromisoformat(_micros(text))


def parse_date(text: str) -> _dt.date:
    return _dt.date.fromisoformat(text)


def parse_datetime(text: str) -> _dt.datetime:
    """Accepts both LocalDateTime and ZonedDateTime forms; an unknown zone id keeps the fixed offset."""
    zone = None
    if text.endswith("]") and "[" in text:
        text, zone = text[:-1].split("[", 1)
    value = _dt.datetime.fromisoformat(_micros(text))
    if zone is not None:
        try:
            tz = ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            return value
        value = value.replace(tzinfo=tz) if value.tzinfo is None else value.astimezone(tz)
    return value
