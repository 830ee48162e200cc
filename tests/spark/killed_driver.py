"""A Spark driver that starts a Tessera cluster (1 ps task, 2 workers in
sync training: spark_test.killed_main, which reports into the directory
given) and then only waits, for spark_test.py to SIGKILL it."""

import os
import signal
import sys

from pyspark.sql import SparkSession

import spark_test
import tessera.spark

spark = (SparkSession.builder.master("local[4]").appName("tessera-killed-driver")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
tessera.spark.run(spark.sparkContext, spark_test.killed_main, sys.argv[1], num_ps=1,
                  num_workers=2)
print(f"driver {os.getpid()}: the cluster runs", flush=True)
while True:
    signal.pause()
