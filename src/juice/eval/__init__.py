"""Evaluation: the paper's metrics (:mod:`.metrics`), one batched runner (:mod:`.runner`),
hyperparameter tuning on validation splits (:mod:`.tuning`), statistics (:mod:`.stats`), tables
with intervals (:mod:`.tables`) and their rendering (:mod:`.report`)."""
