"""The run history (harness/history/store.py): every measurement kept, for trends and change points."""
