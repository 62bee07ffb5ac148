-- Sensor readings, a partition-friendly workload (streamtx bench partitions).
--
-- Every table the dataflow touches is partitioned by `sensor` or replicated,
-- and its one procedure runs ON STREAM readings, partitioned by `sensor` too:
-- a batch whose sensors all belong to one partition is a local command on that
-- partition alone, so P partitions process P such batches at the same time.

CREATE TABLE sensors (
    sensor BIGINT PRIMARY KEY,
    site INTEGER NOT NULL,
    scale DOUBLE NOT NULL,                -- calibration: value * scale + bias
    bias DOUBLE NOT NULL,
    threshold DOUBLE NOT NULL             -- a calibrated value above it is an alert
) REPLICATED;
CREATE TABLE sensor_stats (
    sensor BIGINT PRIMARY KEY,
    n BIGINT NOT NULL,
    total DOUBLE NOT NULL,
    lo DOUBLE NOT NULL,
    hi DOUBLE NOT NULL,
    alerts BIGINT NOT NULL,
    last_ts BIGINT NOT NULL
) PARTITION BY (sensor);
CREATE TABLE reading_log (
    sensor BIGINT NOT NULL,
    ts BIGINT NOT NULL,
    value DOUBLE NOT NULL,
    calibrated DOUBLE NOT NULL,
    batch BIGINT NOT NULL                 -- the batch id that took the reading
) PARTITION BY (sensor);

CREATE STREAM readings (sensor BIGINT, ts BIGINT, value DOUBLE) PARTITION BY (sensor);

CREATE PROCEDURE setup (num_sensors BIGINT) AS BEGIN
    INSERT INTO sensors
        SELECT i, (i % 97)::INTEGER, 1.0 + (i % 7) / 100.0, (i % 11) / 10.0, 0.9 + (i % 5) / 100.0
        FROM range($num_sensors) t(i);
END;

-- Per batch: calibrate every reading against the replicated sensor table, log it,
-- and fold the batch into the per-sensor aggregates (an upsert per sensor).
CREATE PROCEDURE ingest ON STREAM readings AS BEGIN
    INSERT INTO reading_log
        SELECT r.sensor, r.ts, r.value, r.value * s.scale + s.bias, $ts
        FROM readings r JOIN sensors s ON s.sensor = r.sensor;
    INSERT INTO sensor_stats
        SELECT l.sensor, count(*), sum(l.calibrated), min(l.calibrated), max(l.calibrated),
               count(*) FILTER (WHERE l.calibrated > l.threshold), max(l.ts)
        FROM (SELECT r.sensor, r.ts, r.value * s.scale + s.bias AS calibrated, s.threshold
              FROM readings r JOIN sensors s ON s.sensor = r.sensor) l
        GROUP BY l.sensor
        ON CONFLICT DO UPDATE SET
            n = sensor_stats.n + excluded.n,
            total = sensor_stats.total + excluded.total,
            lo = least(sensor_stats.lo, excluded.lo),
            hi = greatest(sensor_stats.hi, excluded.hi),
            alerts = sensor_stats.alerts + excluded.alerts,
            last_ts = greatest(sensor_stats.last_ts, excluded.last_ts);
END;
