"""Evaluation: the verdict of an output under its record's metric (:mod:`.verdicts`), one batched
runner (:mod:`.runner`), hyperparameter tuning on validation splits (:mod:`.tuning`), statistics
(:mod:`.stats`), tables with intervals (:mod:`.tables`) and their rendering (:mod:`.report`)."""
