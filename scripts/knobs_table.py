"""Print the README's "Knobs" table: each knob of memledger.article.knobs.RUNGS and the bytes it saves at the peak.

    PYTHONPATH=. python scripts/knobs_table.py        # Markdown, for README.md
"""
from memledger.article.knobs import knob_table

if __name__ == "__main__":
    print(knob_table().markdown())
