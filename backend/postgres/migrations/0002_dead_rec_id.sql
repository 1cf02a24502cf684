CREATE INDEX {{p}}_dead_rec ON {{p}}_dead USING hash (rec_id);
