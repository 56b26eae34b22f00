1
login/auth/login"POST*authB
login (<
auth/auth*auth/
users
/api/users*users2/users8B	
api (<3
orders/api/orders*orders2/orders8B	
api (<q
overview/api/overview8B	
api (<HÐòE

userusers/users/{rest} 
#
ordersorders/orders/{rest}(è"O
auth(
auth-servicehttp://auth-service:4000
/healthzˆ'Ð ("N"E
users
users-1http://users-1:7001
/healthˆ'Ð ("N"6
orders
/healthèô ("NB
ordersÚ6è