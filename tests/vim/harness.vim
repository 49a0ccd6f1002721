" Helpers for tests/vim/test_vim.py around the README's Vim snippet: wait for a mission state, write down
" what Vim saw (missions, status, its message history with any errors) as one JSON line.
func KeelTestWait(state, seconds) abort
  let start = reltime()
  while index(values(g:keel_missions), a:state) < 0 && reltimefloat(reltime(start)) < a:seconds
    sleep 50m
  endwhile
endfunc

func KeelTestWrite(path) abort
  let seen = #{missions: g:keel_missions, status: g:keel_status, errmsg: v:errmsg}
  let seen.messages = split(execute('messages'), "\n")
  call writefile([json_encode(seen)], a:path)
endfunc
