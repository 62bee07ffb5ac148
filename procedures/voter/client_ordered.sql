-- The voter the H-Store way, for comparison: no streams, windows or triggers.
-- The same three steps are plain OLTP procedures, and the client calls them
-- one after another for every batch of votes (procedures/voter/client_ordered.py),
-- passing each step's result to the next: the ordering lives in the client.
-- The trending window is a table the procedure maintains by hand (slide 1).

CREATE TABLE trending_votes (seq BIGINT PRIMARY KEY, contestant_number INTEGER NOT NULL);

CREATE PROCEDURE vote_call (vote_ids BIGINT[], phone_numbers BIGINT[], contestant_numbers INTEGER[]) AS BEGIN
    WITH votes_in AS (
        SELECT unnest($vote_ids) AS vote_id, unnest($phone_numbers) AS phone_number,
               unnest($contestant_numbers) AS contestant_number
    ), valid AS (
        SELECT v.*, row_number() OVER (PARTITION BY v.phone_number ORDER BY v.vote_id) AS nth
        FROM votes_in v JOIN contestants c ON c.contestant_number = v.contestant_number
    ), judged AS (
        SELECT valid.*, coalesce(p.num_votes, 0) + valid.nth
                        <= (SELECT max_votes FROM voter_config WHERE id = 1) AS ok
        FROM valid LEFT JOIN phone_votes p ON p.phone_number = valid.phone_number
    )
    INSERT INTO votes
        SELECT j.vote_id, j.phone_number, coalesce(a.state, 'XX'), j.contestant_number, $ts
        FROM judged j LEFT JOIN area_code_state a ON a.area_code = j.phone_number // 10000000
        WHERE j.ok;
    INSERT INTO phone_votes
        SELECT phone_number, count(*) FROM votes WHERE created = $ts GROUP BY phone_number
        ON CONFLICT DO UPDATE SET num_votes = phone_votes.num_votes + excluded.num_votes;
    SELECT vote_id, contestant_number FROM votes WHERE created = $ts ORDER BY vote_id;
END;

CREATE PROCEDURE leaderboard_call (vote_ids BIGINT[], contestant_numbers INTEGER[]) AS BEGIN
    INSERT INTO trending_votes
        SELECT (SELECT coalesce(max(seq), 0) FROM trending_votes) + row_number() OVER (ORDER BY vote_id),
               contestant_number
        FROM (SELECT unnest($vote_ids) AS vote_id, unnest($contestant_numbers) AS contestant_number);
    DELETE FROM trending_votes
        WHERE seq <= (SELECT max(seq) FROM trending_votes) - (SELECT trending_window FROM voter_config WHERE id = 1);
    DELETE FROM leaderboard WHERE board = 'trending';
    INSERT INTO leaderboard
        SELECT 'trending', r, contestant_number, n FROM (
            SELECT t.contestant_number, count(*) AS n,
                   row_number() OVER (ORDER BY count(*) DESC, t.contestant_number) AS r
            FROM trending_votes t JOIN contestants c ON c.contestant_number = t.contestant_number
            GROUP BY t.contestant_number
        ) WHERE r <= 3;
    INSERT INTO contestant_votes
        SELECT contestant_number, count(*) FROM (SELECT unnest($contestant_numbers) AS contestant_number)
        GROUP BY contestant_number
        ON CONFLICT DO UPDATE SET num_votes = contestant_votes.num_votes + excluded.num_votes;
    UPDATE vote_counter SET total = total + len($vote_ids) WHERE id = 1;
    DELETE FROM leaderboard WHERE board IN ('top', 'bottom');
    INSERT INTO leaderboard
        SELECT 'top', r, contestant_number, n FROM (
            SELECT c.contestant_number, coalesce(v.num_votes, 0) AS n,
                   row_number() OVER (ORDER BY coalesce(v.num_votes, 0) DESC, c.contestant_number) AS r
            FROM contestants c LEFT JOIN contestant_votes v ON v.contestant_number = c.contestant_number
        ) WHERE r <= 3;
    INSERT INTO leaderboard
        SELECT 'bottom', r, contestant_number, n FROM (
            SELECT c.contestant_number, coalesce(v.num_votes, 0) AS n,
                   row_number() OVER (ORDER BY coalesce(v.num_votes, 0), c.contestant_number) AS r
            FROM contestants c LEFT JOIN contestant_votes v ON v.contestant_number = c.contestant_number
        ) WHERE r <= 3;
    SELECT contestant_number FROM (
            SELECT c.contestant_number
            FROM contestants c LEFT JOIN contestant_votes v ON v.contestant_number = c.contestant_number
            ORDER BY coalesce(v.num_votes, 0), c.contestant_number
            LIMIT 1
        )
        WHERE (SELECT count(*) FROM contestants) > 1
          AND (SELECT total FROM vote_counter WHERE id = 1) // (SELECT delete_every FROM voter_config WHERE id = 1)
            > ((SELECT total FROM vote_counter WHERE id = 1) - len($vote_ids))
              // (SELECT delete_every FROM voter_config WHERE id = 1);
END;

CREATE PROCEDURE delete_call (contestant INTEGER) AS BEGIN
    UPDATE phone_votes SET num_votes = phone_votes.num_votes - d.n
        FROM (SELECT phone_number, count(*) AS n FROM votes WHERE contestant_number = $contestant
              GROUP BY phone_number) d
        WHERE phone_votes.phone_number = d.phone_number;
    DELETE FROM phone_votes WHERE num_votes = 0;
    DELETE FROM votes WHERE contestant_number = $contestant;
    DELETE FROM contestant_votes WHERE contestant_number = $contestant;
    DELETE FROM leaderboard WHERE contestant_number = $contestant;
    DELETE FROM contestants WHERE contestant_number = $contestant;
END;
