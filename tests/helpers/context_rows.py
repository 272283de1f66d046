"""NQ-Swap-shaped rows for the context-type tests (:mod:`juice.data.context_types`)."""

from __future__ import annotations

ROWS = [{"question": f"who wrote book {i}", "org_context": f"<P> Book {i} was written by {a} . </P>",
         "org_answer": [a], "sub_context": f"<P> Book {i} was written by {b} . </P>", "sub_answer": [b]}
        for i, (a, b) in enumerate([("Tolstoy", "Dickens"), ("Austen", "Orwell"), ("Homer", "Virgil"),
                                    ("Dante", "Goethe"), ("Austen", "Kafka")])]
"""Five NQ-Swap rows (who wrote book i; two share the answer Austen) that give every context type."""
