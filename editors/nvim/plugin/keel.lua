-- keel's :Keel command. Loading the plugin starts nothing: require("keel").setup() does (README.md).
if vim.g.loaded_keel then
  return
end
vim.g.loaded_keel = true

vim.api.nvim_create_user_command("Keel", function(opts)
  require("keel.command").run(opts)
end, {
  nargs = "*",
  complete = function(lead, line, pos)
    return require("keel.command").complete(lead, line, pos)
  end,
  desc = "keel missions|start|pause|resume|answer|points|restore",
})
