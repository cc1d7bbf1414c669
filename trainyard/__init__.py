"""The Trainyard SDK: the small library that runs inside training processes (metrics,
checkpoint helpers, environment parsing) and a thin REST client. It never imports Django.

    from trainyard import log_metric
    log_metric("loss", loss.item(), step)

docs/SPEC.md §3–4 define the contracts."""

from trainyard.metrics import MetricsLogger, flush, get_logger, log_metric, log_metrics

__version__ = "0.1.0"

__all__ = ["MetricsLogger", "__version__", "flush", "get_logger", "log_metric", "log_metrics"]
