"""Event files and summaries for TensorBoard, written synchronously without TensorFlow.

Written with TensorBoard's own protos and record writer, so that a run's folder is complete
when :meth:`EventFile.close` returns (no writer thread), and so that one event can carry
all of a step's tags: TensorBoard's loader drops earlier events of a tag when a later event
has a smaller step (``EventAccumulator._CheckForOutOfOrderStepAndMaybePurge``), so every run
is written step by step, each step once.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from google.protobuf import struct_pb2
from PIL import Image as PILImage
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

HParamValue = str | float | int | bool


def write_run(
    folder: Path, steps: Mapping[int, Sequence[summary_pb2.Summary.Value]], *, wall_time: float
) -> None:
    """Write one run: an events file in ``folder`` with one event per step, steps ascending
    (TensorBoard purges a tag's later events when a step goes back), empty steps left out."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"events.out.tfevents.{int(wall_time)}.alm_opacus"
    with open(path, "wb") as handle:
        writer = RecordWriter(handle)
        header = event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2")
        writer.write(header.SerializeToString())
        for step in sorted(steps):
            if steps[step]:
                summary = summary_pb2.Summary(value=list(steps[step]))
                event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary)
                writer.write(event.SerializeToString())


def scalars(values: Mapping[str, float]) -> list[summary_pb2.Summary.Value]:
    """Scalar values by tag; nan values are left out (a gap, not a point)."""
    return [
        summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in values.items()
        if not math.isnan(value)
    ]


def _string_tensor(data: bytes) -> tensor_pb2.TensorProto:
    return tensor_pb2.TensorProto(
        dtype=7,
        string_val=[data],  # DT_STRING
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[]),
    )


def text(tag: str, markdown: str) -> summary_pb2.Summary.Value:
    """A text-plugin value (rendered as Markdown)."""
    meta = text_metadata.create_summary_metadata(display_name=tag, description="")
    return summary_pb2.Summary.Value(
        tag=tag, metadata=meta, tensor=_string_tensor(markdown.encode())
    )


def png(tag: str, data: bytes) -> summary_pb2.Summary.Value:
    """A PNG file's bytes as an image value."""
    width, height = PILImage.open(io.BytesIO(data)).size
    image = summary_pb2.Summary.Image(
        height=height, width=width, colorspace=4, encoded_image_string=data
    )
    return summary_pb2.Summary.Value(tag=tag, image=image)


def custom_scalars(layout: layout_pb2.Layout) -> summary_pb2.Summary.Value:
    """The custom-scalars plugin's layout (one per logdir, in the root run)."""
    return summary_pb2.Summary.Value(
        tag=custom_scalar_metadata.CONFIG_SUMMARY_TAG,
        metadata=custom_scalar_metadata.create_summary_metadata(),
        tensor=_string_tensor(layout.SerializeToString()),
    )


def _hparams_value(tag: str, data: plugin_data_pb2.HParamsPluginData) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(
        tag=tag,
        metadata=hparams_metadata.create_summary_metadata(data),
        tensor=hparams_metadata.NULL_TENSOR,
    )


def _proto_value(value: HParamValue) -> struct_pb2.Value:
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, int | float):
        return struct_pb2.Value(number_value=float(value))
    return struct_pb2.Value(string_value=str(value))


def hparams_experiment(
    sessions: Sequence[Mapping[str, HParamValue]],
    metrics: Mapping[str, str],
    *,
    columns: Sequence[str] | None = None,
    display_names: Mapping[str, str] | None = None,
) -> summary_pb2.Summary.Value:
    """The hparams plugin's experiment: one column per hparam (strings and booleans with
    their observed values as a discrete domain) and one per metric tag (``metrics``: tag ->
    display name, in column order).

    TensorBoard 2.21 lists the hparams of the experiment by ``differs`` (marked first), then
    by name, and its HParams view shows the first five as columns (the rest unticked);
    hparams a session has but the experiment does not list are not shown at all.

    Args:
        sessions: the hparams of each session.
        metrics: metric tag -> display name.
        columns: the hparams to list, each marked ``differs`` (so all are shown where there
            are at most five); ``None``: every hparam of ``sessions``, marked ``differs``
            where its value differs between sessions.
        display_names: hparam -> the name the view shows (default: the hparam's name).

    Returns:
        The summary value that carries the experiment (for the root run).
    """
    infos = []
    names = list(dict.fromkeys(name for session in sessions for name in session))
    for name in names if columns is None else columns:
        values = list(dict.fromkeys(s[name] for s in sessions if name in s))
        if all(isinstance(v, bool) for v in values):
            kind = api_pb2.DATA_TYPE_BOOL
        elif all(isinstance(v, int | float) for v in values):
            kind = api_pb2.DATA_TYPE_FLOAT64
        else:
            kind = api_pb2.DATA_TYPE_STRING
            values = sorted({str(v) for v in values})
        info = api_pb2.HParamInfo(
            name=name,
            display_name=(display_names or {}).get(name, ""),
            type=kind,
            differs=len(values) > 1 if columns is None else True,
        )
        if kind != api_pb2.DATA_TYPE_FLOAT64:
            info.domain_discrete.extend(values)
        infos.append(info)
    experiment = api_pb2.Experiment(
        hparam_infos=infos,
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=shown_as)
            for tag, shown_as in metrics.items()
        ],
    )
    data = plugin_data_pb2.HParamsPluginData(experiment=experiment, version=0)
    return _hparams_value(hparams_metadata.EXPERIMENT_TAG, data)


def hparams_session(
    hparams: Mapping[str, HParamValue], *, wall_time: float
) -> tuple[summary_pb2.Summary.Value, summary_pb2.Summary.Value]:
    """The start and end of one hparams session (its metrics are scalars in the same run).
    Non-finite numbers are left out: the plugin serves hparams as JSON, which has no inf."""
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=wall_time)
    for name, value in hparams.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        start.hparams[name].CopyFrom(_proto_value(value))
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=wall_time)
    return (
        _hparams_value(
            hparams_metadata.SESSION_START_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_start_info=start, version=0),
        ),
        _hparams_value(
            hparams_metadata.SESSION_END_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_end_info=end, version=0),
        ),
    )
