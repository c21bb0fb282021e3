"""What a checkpoint holds, read without running the job's code here: the reader (weights-only, or in
the job's confinement through ``confined/``), each file's own format, and the key-by-key diff."""
