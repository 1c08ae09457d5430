"""The Spark configuration of the tests' local sessions and spark-submit runs: no UI, two shuffle
partitions, the driver on loopback."""

SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
              "spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
