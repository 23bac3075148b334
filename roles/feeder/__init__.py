"""A feeder: the process that reads its parts of the data and feeds them to the cluster
(``python -m roles.feeder`` or ``zbus-feeder``). Its loop and message handlers are in
``process``; the streams of its parts in ``streams``."""
