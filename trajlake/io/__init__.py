"""Readers and writers of other formats: the trajlake-jsonl interchange format, importers, exports."""
