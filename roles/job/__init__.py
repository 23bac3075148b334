"""The job: its settings (one frozen object from the job file and ``ZBUS_*`` variables), the
command line every role shares, and the files a run leaves."""
